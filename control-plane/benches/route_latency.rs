//! `POST /v1/route` latency over loopback HTTP, as the Envoy filter sees it: a ~32k-token
//! chat prompt whose earlier turns are already in the tokenizer's segment cache (the
//! agentic / multi-turn case), and a cold prompt of the same size (every segment new).
//!
//! A real nats-server and the real Qwen3 tokenizer; the service runs in-process. The decode
//! worker's KV for the conversation is published on NATS first, so the index match walks
//! the whole prefix. Bounded: a fixed number of requests per case, each case capped in time.
//!
//! Run: `cargo bench -p switchyard-control-plane --bench route_latency`
//! (env `SWITCHYARD_BENCH_WARM_REQUESTS`, `SWITCHYARD_BENCH_COLD_REQUESTS` override counts).

#[path = "../tests/control_plane/common/mod.rs"]
mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use switchyard_control_plane::settings::Settings;
use switchyard_protocol::hash::{sequence_hashes, BlockSize, HashSeed};
use switchyard_protocol::kv::{EngineBlockId, KvEvent, KvEventBatch, StoredBlock};
use switchyard_protocol::route::{ApiKind, Verdict};
use switchyard_protocol::subjects;
use switchyard_protocol::worker::WorkerRole;

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

/// A conversation of `turns` user/assistant exchanges of ~`words_per_msg` words each.
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
    let pct = |p: f64| samples[((n as f64 - 1.0) * p).round() as usize];
    Stats {
        n,
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        mean_ms: samples.iter().sum::<f64>() / n as f64,
        isl,
    }
}

async fn timed_route(base: &str, body: &Value) -> (f64, Verdict) {
    let text = body.to_string();
    let start = tokio::time::Instant::now();
    let resp = route(base, "chat", None, text).await;
    assert_eq!(resp.status(), 200);
    let verdict: Verdict = resp.json().await.unwrap();
    (start.elapsed().as_secs_f64() * 1e3, verdict)
}

fn count(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
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
        count("SWITCHYARD_BENCH_COLD_REQUESTS", 30)
    };

    let mut settings = Settings::for_tests();
    settings.route_tokenize_threads = 2;
    let (_nats_server, svc, nats) = service_with_nats(settings).await;
    let decode = register_worker(&svc, &nats, "decode-0", WorkerRole::Decode, 9001).await;
    register_worker(&svc, &nats, "prefill-0", WorkerRole::Prefill, 9100).await;

    // ~32k tokens: 18 exchanges of ~600 words (tags of equal length in both cases).
    let history = conversation("conv", 18, 600);
    let first = with_question(&history, "warm-up question");
    let tokens = tokenizer().tokenize(ApiKind::Chat, &first).unwrap();
    // The decode worker holds the conversation: publish its blocks as the worker would.
    let bs = BlockSize::try_new(decode.block_size).unwrap();
    let blocks: Vec<StoredBlock> = sequence_hashes(&tokens, bs, HashSeed::default())
        .into_iter()
        .enumerate()
        .map(|(i, seq_hash)| StoredBlock {
            seq_hash,
            block_id: EngineBlockId(i as u64),
        })
        .collect();
    let n_blocks = blocks.len();
    let batch = KvEventBatch {
        v: 1,
        worker_id: decode.worker_id.clone(),
        instance_id: 1,
        seq: 1,
        resync: false,
        events: vec![KvEvent::Stored {
            parent: None,
            blocks,
            block_size: decode.block_size,
        }],
    };
    nats.publish(
        subjects::kv_events(&decode.worker_id),
        serde_json::to_vec(&batch).unwrap().into(),
    )
    .await
    .unwrap();
    nats.flush().await.unwrap();
    // Warm the segment cache and wait for the blocks to be indexed.
    eventually(Duration::from_secs(10), "conversation cached", || async {
        timed_route(&svc.base, &first).await.1.cached_tokens > 0
    })
    .await;

    let case_start = tokio::time::Instant::now();
    let mut warm = Vec::new();
    let mut warm_isl = 0;
    for i in 0..warm_requests {
        if case_start.elapsed() > CASE_TIME_LIMIT {
            break;
        }
        let (ms, v) = timed_route(
            &svc.base,
            &with_question(&history, &format!("new question {i}?")),
        )
        .await;
        warm_isl = v.isl;
        warm.push(ms);
    }

    let case_start = tokio::time::Instant::now();
    let mut cold = Vec::new();
    let mut cold_isl = 0;
    for i in 0..cold_requests {
        if case_start.elapsed() > CASE_TIME_LIMIT {
            break;
        }
        // A letters-only tag as long as "conv", so both cases tokenize to similar lengths.
        let tag: String = [i / 676, i / 26, i]
            .iter()
            .map(|d| char::from(b'a' + (d % 26) as u8))
            .collect();
        let fresh = conversation(&format!("x{tag}"), 18, 600);
        let (ms, v) = timed_route(&svc.base, &with_question(&fresh, "first question?")).await;
        cold_isl = v.isl;
        cold.push(ms);
    }
    // Warm requests while cold prompts are tokenized back to back on another connection:
    // tokenization runs on blocking threads, so a cold prompt delays others only through
    // CPU sharing (2 cores here) and the tokenize permits, not by stalling the router.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let cold_done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let background = {
        let stop = stop.clone();
        let cold_done = cold_done.clone();
        let base = svc.base.clone();
        tokio::spawn(async move {
            let mut i = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && i < 1_000 {
                let tag: String = [i / 676, i / 26, i]
                    .iter()
                    .map(|d| char::from(b'a' + (d % 26) as u8))
                    .collect();
                let fresh = conversation(&format!("y{tag}"), 18, 600);
                timed_route(&base, &with_question(&fresh, "first question?")).await;
                i += 1;
                cold_done.store(i, std::sync::atomic::Ordering::Relaxed);
            }
            i
        })
    };
    let case_start = tokio::time::Instant::now();
    let mut mixed = Vec::new();
    // At least 100 warm requests and until 10 cold prompts ran alongside (bounded).
    let want_cold = if smoke { 1 } else { 10 };
    for i in 0..5_000 {
        let enough = i >= warm_requests.min(100)
            && cold_done.load(std::sync::atomic::Ordering::Relaxed) >= want_cold;
        if enough || case_start.elapsed() > CASE_TIME_LIMIT {
            break;
        }
        let question = format!("mixed question {i}?");
        let (ms, _) = timed_route(&svc.base, &with_question(&history, &question)).await;
        mixed.push(ms);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let cold_in_background = background.await.unwrap_or(0);
    svc.stop().await;

    println!("\nPOST /v1/route over loopback HTTP (client-measured), KV index holding {n_blocks} blocks of the conversation\n");
    println!("| case | requests | prompt tokens | p50 ms | p99 ms | mean ms |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, s) in [
        (
            "32k chat, earlier turns in segment cache",
            stats(warm, warm_isl),
        ),
        ("32k chat, cold (every segment new)", stats(cold, cold_isl)),
        (
            "32k chat, cached turns, while cold 32k prompts run alongside",
            stats(mixed, warm_isl),
        ),
    ] {
        println!(
            "| {name} | {} | {} | {:.2} | {:.2} | {:.2} |",
            s.n, s.isl, s.p50_ms, s.p99_ms, s.mean_ms
        );
    }
    println!("\n({cold_in_background} cold prompts were routed alongside the last case.)");
}
