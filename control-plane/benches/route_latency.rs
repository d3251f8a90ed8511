//! `POST /v1/route` latency over loopback HTTP, as the Envoy filter sees it, at 8k, 32k and
//! 128k prompt tokens:
//! - **warm**: a 64-turn chat whose earlier turns are in the tokenizer's cache and whose blocks
//!   the decode worker holds (the agentic / multi-turn case: each call adds a new question);
//! - **growing**: one user message that gains a sentence every call (trace replays and many
//!   agent frameworks: no special tokens between turns);
//! - **cold**: a chat of the same size that nobody has seen;
//! - at 32k, warm calls while cold prompts are routed back to back alongside;
//! - **HTTP floor**: the warm case's bodies made invalid by one leading byte, which the
//!   service reads whole and refuses at the parser's first byte: what moving the body and an
//!   answer over loopback HTTP costs with no prompt work at all, in the same run.
//!
//! A real nats-server and the real Qwen3 tokenizer; the service runs in-process. The decode
//! worker's KV for each conversation is published on NATS first, so the index match walks the
//! whole prefix. Bounded: a fixed number of requests per case, each case capped in time.
//!
//! Run: `cargo bench -p switchyard-control-plane --bench route_latency`
//! (env `SWITCHYARD_BENCH_WARM_REQUESTS`, `SWITCHYARD_BENCH_COLD_REQUESTS` override counts;
//! `SWITCHYARD_BENCH_SIZES=128k` runs only the sizes listed, e.g. under a profiler).

#[path = "../tests/control_plane/common/mod.rs"]
mod common;

use std::time::Duration;

use common::*;
// The control plane's allocator, so the figures are the service's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use serde_json::{json, Value};
use switchyard_control_plane::settings::Settings;
use switchyard_protocol::hash::{sequence_hashes, BlockSize, HashSeed};
use switchyard_protocol::kv::{EngineBlockId, KvEvent, KvEventBatch, StoredBlock};
use switchyard_protocol::lifecycle::{LifecycleBatch, LifecycleEvent, LIFECYCLE_PATH};
use switchyard_protocol::route::{ApiKind, Verdict};
use switchyard_protocol::subjects;
use switchyard_protocol::worker::{WorkerInfo, WorkerRole};

/// Per-case time cap, whatever the request count.
const CASE_TIME_LIMIT: Duration = Duration::from_secs(120);

fn words(tag: &str, n: usize) -> String {
    let vocab = [
        "the",
        "router",
        "keeps",
        "each",
        "session",
        "near",
        "its",
        "cache",
        "while",
        "long",
        "prompts",
        "prefill",
        "elsewhere",
        "tool",
        "call",
        "result",
    ];
    (0..n)
        .map(|i| {
            if i % 16 == 0 {
                format!("{tag}-{i}")
            } else {
                vocab[(i * 5 + tag.len()) % vocab.len()].to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A conversation of `turns` user/assistant exchanges of ~`words_per_msg` words each, after a
/// system prompt of as many words.
fn conversation(tag: &str, turns: usize, words_per_msg: usize) -> Vec<Value> {
    let mut messages =
        vec![json!({"role": "system", "content": words(&format!("{tag}-sys"), words_per_msg)})];
    for t in 0..turns {
        messages
            .push(json!({"role": "user", "content": words(&format!("{tag}-u{t}"), words_per_msg)}));
        messages.push(
            json!({"role": "assistant", "content": words(&format!("{tag}-a{t}"), words_per_msg)}),
        );
    }
    messages
}

fn with_question(history: &[Value], question: &str) -> Value {
    let mut messages = history.to_vec();
    messages.push(json!({"role": "user", "content": question}));
    json!({"model": "qwen3", "messages": messages})
}

struct Stats {
    n: usize,
    p50_ms: f64,
    p99_ms: f64,
    mean_ms: f64,
    isl: u32,
}

fn stats(mut samples: Vec<f64>, isl: u32) -> Stats {
    samples.sort_by(|a, b| a.total_cmp(b));
    let n = samples.len();
    if n == 0 {
        return Stats {
            n,
            p50_ms: f64::NAN,
            p99_ms: f64::NAN,
            mean_ms: f64::NAN,
            isl,
        };
    }
    let pct = |p: f64| samples[((n as f64 - 1.0) * p).round() as usize];
    Stats {
        n,
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        mean_ms: samples.iter().sum::<f64>() / n as f64,
        isl,
    }
}

/// One client for every call, its connections kept alive: Envoy's filter reaches the control
/// plane through a cluster's connection pool, so a route call does not pay a TCP handshake.
/// Used only on [`on_client`]'s runtime, where its connections live.
fn client() -> &'static reqwest::Client {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    CLIENT.get_or_init(reqwest::Client::new)
}

/// Runs a client call on a runtime of its own thread. The filter's route calls come from
/// Envoy's worker thread, outside the control plane's process, so the service's two runtime
/// threads here serve the service alone, as in production; before 2026-12-06 the bench's
/// client tasks shared them (`SWITCHYARD_BENCH_SHARED_RUNTIME=1` keeps that, for comparison).
async fn on_client<F>(call: F) -> F::Output
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    static CLIENT_RUNTIME: std::sync::OnceLock<tokio::runtime::Handle> = std::sync::OnceLock::new();
    if std::env::var_os("SWITCHYARD_BENCH_SHARED_RUNTIME").is_some() {
        return call.await;
    }
    let runtime = CLIENT_RUNTIME.get_or_init(|| {
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("bench-client".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("the client's runtime");
                handle_tx
                    .send(runtime.handle().clone())
                    .expect("the bench waits for the handle");
                runtime.block_on(std::future::pending::<()>());
            })
            .expect("the client's thread");
        handle_rx.recv().expect("the client's runtime starts")
    });
    runtime.spawn(call).await.expect("a client call")
}

/// Posts `text` to the route API on [`on_client`]'s runtime; the response and how long it
/// took to read, body included, with `read` (the status checked first against `status`).
async fn timed_post<T: Send + 'static>(
    base: &str,
    text: String,
    status: u16,
    read: impl FnOnce(bytes::Bytes) -> T + Send + 'static,
) -> (f64, T) {
    let url = format!("{base}/v1/route");
    on_client(async move {
        let start = tokio::time::Instant::now();
        let resp = client()
            .post(url)
            .header(switchyard_protocol::route::API_HEADER, "chat")
            .body(text)
            .send()
            .await
            .expect("route call");
        assert_eq!(resp.status(), status);
        let body = resp.bytes().await.expect("the answer's body");
        (start.elapsed().as_secs_f64() * 1e3, read(body))
    })
    .await
}

async fn timed_route(base: &str, body: &Value) -> (f64, Verdict) {
    timed_post(base, body.to_string(), 200, |bytes| {
        serde_json::from_slice::<Verdict>(&bytes).expect("a verdict")
    })
    .await
}

/// Posts `body` with one byte put in front, so the service reads it whole and refuses it at
/// the JSON parser's first byte: the HTTP floor of a route call of that size.
async fn timed_refusal(base: &str, body: &Value) -> f64 {
    timed_post(base, format!("x{body}"), 400, |_| ()).await.0
}

fn count(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One prompt size: words per message of a 64-turn conversation (32 exchanges).
struct Size {
    label: &'static str,
    words_per_msg: usize,
}

/// ~1.58 Qwen3 tokens per word of `words()`: 65 messages of these sizes give ~8k, ~32k and
/// ~128k tokens.
const SIZES: [Size; 3] = [
    Size {
        label: "8k",
        words_per_msg: 78,
    },
    Size {
        label: "32k",
        words_per_msg: 315,
    },
    Size {
        label: "128k",
        words_per_msg: 1260,
    },
];
const EXCHANGES: usize = 32;

/// A letters-only tag of `len` characters for request `i`, so every case tokenizes to similar
/// lengths.
fn tag(i: usize) -> String {
    [i / 676, i / 26, i]
        .iter()
        .map(|d| char::from(b'a' + (d % 26) as u8))
        .collect()
}

/// Publishes the blocks of `body`'s prompt as held by `worker` (as the worker would after
/// serving it) and waits until a route call sees them.
async fn hold_prompt(
    svc: &Service,
    nats: &async_nats::Client,
    worker: &WorkerInfo,
    body: &Value,
    seq: u64,
) {
    let tokens = tokenizer().tokenize(ApiKind::Chat, body).unwrap();
    let bs = BlockSize::try_new(worker.block_size).unwrap();
    let blocks: Vec<StoredBlock> = sequence_hashes(&tokens, bs, HashSeed::default())
        .into_iter()
        .enumerate()
        .map(|(i, seq_hash)| StoredBlock {
            seq_hash,
            block_id: EngineBlockId(seq * 1_000_000 + i as u64),
        })
        .collect();
    let batch = KvEventBatch {
        v: 1,
        worker_id: worker.worker_id.clone(),
        instance_id: 1,
        seq,
        resync: false,
        events: vec![KvEvent::Stored {
            parent: None,
            parent_block_id: None,
            blocks,
            block_size: worker.block_size,
        }],
    };
    nats.publish(
        subjects::kv_events(&worker.worker_id),
        serde_json::to_vec(&batch).unwrap().into(),
    )
    .await
    .unwrap();
    nats.flush().await.unwrap();
    eventually(Duration::from_secs(10), "prompt cached", || async {
        timed_route(&svc.base, body).await.1.cached_tokens > 0
    })
    .await;
}

/// Routes `n` bodies made by `make(i)`, bounded by [`CASE_TIME_LIMIT`]. With `floor`, each
/// call is followed by the same body refused once read ([`timed_refusal`]), so the HTTP floor
/// is measured alternating with the calls, through the same machine noise.
async fn run_case(
    base: &str,
    n: usize,
    mut make: impl FnMut(usize) -> Value,
    mut floor: Option<&mut Vec<f64>>,
) -> Stats {
    let case_start = tokio::time::Instant::now();
    let mut samples = Vec::new();
    let mut isl = 0;
    for i in 0..n {
        if case_start.elapsed() > CASE_TIME_LIMIT {
            break;
        }
        let body = make(i);
        let (ms, v) = timed_route(base, &body).await;
        isl = v.isl;
        samples.push(ms);
        if reports_done() {
            report_done(base, &v.request_id).await;
        }
        if let Some(floor) = floor.as_deref_mut() {
            floor.push(timed_refusal(base, &body).await);
        }
    }
    stats(samples, isl)
}

/// Whether each routed request is reported done after its call (untimed), as the filter does
/// when its response ends: a multi-turn session's turn is over before its next one is routed,
/// so the router tracks about one request per session, not every call of the run.
/// `SWITCHYARD_BENCH_NO_DONE=1` leaves every call in flight, as the bench did before
/// 2026-12-06 (docs/performance.md compares both).
fn reports_done() -> bool {
    std::env::var_os("SWITCHYARD_BENCH_NO_DONE").is_none()
}

async fn report_done(base: &str, request_id: &str) {
    let batch = LifecycleBatch::new(vec![LifecycleEvent::completed(request_id)]);
    let url = format!("{base}{LIFECYCLE_PATH}");
    on_client(async move {
        let resp = client()
            .post(url)
            .json(&batch)
            .send()
            .await
            .expect("lifecycle call");
        assert_eq!(resp.status(), 200);
    })
    .await;
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // `cargo bench` passes `--bench`; a filter argument that is not ours means "not me".
    if std::env::args()
        .skip(1)
        .any(|a| !a.starts_with("--") && a != "route_latency")
    {
        return;
    }
    // Without `--bench` (e.g. `cargo test --benches`) run a quick smoke pass, as criterion
    // benches do in test mode.
    let smoke = !std::env::args().any(|a| a == "--bench");
    let warm_requests = if smoke {
        3
    } else {
        count("SWITCHYARD_BENCH_WARM_REQUESTS", 200)
    };
    let cold_requests = if smoke {
        1
    } else {
        count("SWITCHYARD_BENCH_COLD_REQUESTS", 20)
    };

    let mut settings = Settings::for_tests();
    settings.route_tokenize_threads = 2;
    // The served model's context, as for the simulated GB200 workers (the local tokenizer's
    // folder says 40k).
    settings.max_model_len = Some(262_144);
    let (_nats_server, svc, nats) = service_with_nats(settings).await;
    let decode = register_worker(&svc, &nats, "decode-0", WorkerRole::Decode, 9001).await;
    register_worker(&svc, &nats, "prefill-0", WorkerRole::Prefill, 9100).await;

    let mut rows = Vec::new();
    let mut seq = 0;
    let only = std::env::var("SWITCHYARD_BENCH_SIZES").ok();
    for size in SIZES.iter().filter(|s| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|l| l == s.label))
    }) {
        let history = conversation(
            &format!("conv{}", size.label),
            EXCHANGES,
            size.words_per_msg,
        );
        seq += 1;
        hold_prompt(
            &svc,
            &nats,
            &decode,
            &with_question(&history, "warm-up question"),
            seq,
        )
        .await;
        let mut floor = Vec::new();
        let warm = run_case(
            &svc.base,
            warm_requests,
            |i| with_question(&history, &format!("new question {i}?")),
            Some(&mut floor),
        )
        .await;
        let floor = stats(floor, 0);

        // One message growing by a sentence per call, its start held by the decode worker.
        let opening = words(&format!("grow{}", size.label), size.words_per_msg * 65);
        let single =
            |text: &str| json!({"model": "qwen3", "messages": [{"role": "user", "content": text}]});
        seq += 1;
        hold_prompt(&svc, &nats, &decode, &single(&opening), seq).await;
        let mut grown = opening.clone();
        let growing = run_case(
            &svc.base,
            warm_requests,
            |i| {
                grown.push_str(&format!(" and then step {i} of the plan ran"));
                single(&grown)
            },
            None,
        )
        .await;

        let cold = run_case(
            &svc.base,
            cold_requests,
            |i| {
                let fresh = conversation(
                    &format!("x{}{}", size.label, tag(i)),
                    EXCHANGES,
                    size.words_per_msg,
                );
                with_question(&fresh, "first question?")
            },
            None,
        )
        .await;
        rows.push((size.label, warm, growing, cold, floor));
    }

    // Warm requests while cold prompts are tokenized back to back on another connection:
    // tokenization runs on blocking threads, so a cold prompt delays others only through
    // CPU sharing (2 cores here) and the tokenize permits, not by stalling the router.
    let size = &SIZES[1];
    let history = conversation(
        &format!("conv{}", size.label),
        EXCHANGES,
        size.words_per_msg,
    );
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let cold_done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let background = {
        let stop = stop.clone();
        let cold_done = cold_done.clone();
        let base = svc.base.clone();
        let words_per_msg = size.words_per_msg;
        tokio::spawn(async move {
            let mut i = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && i < 1_000 {
                let fresh = conversation(&format!("y{}", tag(i)), EXCHANGES, words_per_msg);
                timed_route(&base, &with_question(&fresh, "first question?")).await;
                i += 1;
                cold_done.store(i, std::sync::atomic::Ordering::Relaxed);
            }
            i
        })
    };
    let case_start = tokio::time::Instant::now();
    let mut mixed = Vec::new();
    let mut mixed_isl = 0;
    // At least 100 warm requests and until 10 cold prompts ran alongside (bounded).
    let want_cold = if smoke { 1 } else { 10 };
    for i in 0..5_000 {
        let enough = i >= warm_requests.min(100)
            && cold_done.load(std::sync::atomic::Ordering::Relaxed) >= want_cold;
        if enough || case_start.elapsed() > CASE_TIME_LIMIT {
            break;
        }
        let question = format!("mixed question {i}?");
        let (ms, v) = timed_route(&svc.base, &with_question(&history, &question)).await;
        mixed_isl = v.isl;
        mixed.push(ms);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let cold_in_background = background.await.unwrap_or(0);
    svc.stop().await;

    println!("\nPOST /v1/route over loopback HTTP (client-measured), the decode worker holding each warm prompt's blocks\n");
    println!("| case | requests | prompt tokens | p50 ms | p99 ms | mean ms |");
    println!("|---|---:|---:|---:|---:|---:|");
    let print = |name: String, s: &Stats| {
        println!(
            "| {name} | {} | {} | {:.2} | {:.2} | {:.2} |",
            s.n, s.isl, s.p50_ms, s.p99_ms, s.mean_ms
        );
    };
    for (label, warm, growing, cold, floor) in &rows {
        print(
            format!("{label} chat, 64 turns, earlier turns cached"),
            warm,
        );
        print(format!("{label} single message growing each call"), growing);
        print(format!("{label} chat, cold (never seen)"), cold);
        print(
            format!("{label} warm chat's body refused once read (the HTTP floor)"),
            floor,
        );
    }
    print(
        "32k chat, cached turns, while cold 32k prompts run alongside".into(),
        &stats(mixed, mixed_isl),
    );
    println!("\n({cold_in_background} cold prompts were routed alongside the last case.)");
}
