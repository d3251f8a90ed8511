//! Declared workers of engines other than vLLM, against stand-ins (warp on loopback ports)
//! serving what those engines document. No NATS is needed: the control plane gets a URL
//! nothing listens on.
//!
//! - TensorRT-LLM: a stand-in `trtllm-serve` serves `GET /health`, `GET /metrics`
//!   (iteration statistics as JSON) and `POST /kv_cache_events` (drained on read). The
//!   blocks its events store (token ids from the real Qwen3 tokenizer, block hashes the
//!   engine's own) make `/v1/route` report those tokens as cached, and the verdict names the
//!   engine.
//! - SGLang: a prefill and a decode stand-in serve `/health` and SGLang's Prometheus gauges;
//!   a cold long prompt is disaggregated, the verdict names SGLang and carries the prefill
//!   worker's bootstrap port from the pool file.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use switchyard_control_plane::settings::Settings;
use switchyard_protocol::route::ApiKind;
use warp::Filter;

const BLOCK: usize = 16;

/// What the stand-in engine hands out, and how often it was asked.
#[derive(Default)]
struct Engine {
    events: Vec<Value>,
    polls: u32,
}

/// `trtllm-serve`'s event JSON for `tokens`: `created`, then one `stored` chain of every
/// block, the last partly filled.
fn events_for(tokens: &[u32]) -> Vec<Value> {
    let blocks: Vec<Value> = tokens
        .chunks(BLOCK)
        .enumerate()
        .map(|(i, chunk)| {
            json!({
                "type": "stored_block",
                // Engine hashes are 64-bit unsigned, often past i64.
                "block_hash": u64::MAX - i as u64,
                "tokens": chunk.iter().map(|t| json!({
                    "type": "unique_token", "token_id": t, "token_extra_id": 0
                })).collect::<Vec<_>>(),
                "cache_level": 0,
                "priority": 35,
            })
        })
        .collect();
    vec![
        json!({"event_id": 0, "window_size": 40960,
               "data": {"type": "created", "num_blocks_per_cache_level": [1000, 0]}}),
        json!({"event_id": 1, "window_size": 40960,
               "data": {"type": "stored", "parent_hash": null, "blocks": blocks}}),
    ]
}

/// Starts the stand-in on 127.0.0.1:0; its address.
async fn start_engine(state: Arc<Mutex<Engine>>) -> std::net::SocketAddr {
    let health = warp::get().and(warp::path("health")).map(warp::reply);
    let metrics = warp::get().and(warp::path("metrics")).map(|| {
        warp::reply::json(&json!([{
            "iter": 7, "numActiveRequests": 0, "numQueuedRequests": 0,
            "kvCacheStats": {"maxNumBlocks": 1000, "freeNumBlocks": 990, "usedNumBlocks": 10,
                             "tokensPerBlock": BLOCK},
        }]))
    });
    let events = warp::post()
        .and(warp::path("kv_cache_events"))
        .map(move || {
            let mut engine = state.lock().unwrap();
            engine.polls += 1;
            warp::reply::json(&std::mem::take(&mut engine.events))
        });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = warp::serve(health.or(metrics).or(events)).incoming(listener);
    tokio::spawn(server.run());
    addr
}

/// A pool file in `dir` declaring the stand-in at `engine` as TensorRT-LLM worker `trt-0`.
fn trtllm_pool_file(dir: &TempDir, engine: std::net::SocketAddr) -> std::path::PathBuf {
    let pool_file = dir.path().join("pools.yaml");
    std::fs::write(
        &pool_file,
        format!(
            "health: {{ interval_ms: 100, timeout_ms: 500 }}\nmetrics: {{ interval_ms: 100 }}\nmodels:\n  - name: qwen3\n    model_dir: {}\n    block_size: {BLOCK}\n    workers:\n      - {{ id: trt-0, role: agg, address: \"{engine}\", engine: trtllm }}\n",
            model_dir().display()
        ),
    )
    .unwrap();
    pool_file
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trtllm_workers_polled_events_make_its_blocks_cached_and_the_verdict_names_it() {
    let body = json!({"model": "qwen3", "messages": [
        {"role": "user", "content": "Tell me about TensorRT-LLM's KV cache events. ".repeat(12)}
    ]});
    let tokens = tokenizer().tokenize(ApiKind::Chat, &body).unwrap();
    let full_blocks = tokens.len() / BLOCK;
    assert!(
        full_blocks >= 4 && !tokens.len().is_multiple_of(BLOCK),
        "{} tokens",
        tokens.len()
    );
    let state = Arc::new(Mutex::new(Engine {
        events: events_for(&tokens),
        polls: 0,
    }));
    let engine = start_engine(Arc::clone(&state)).await;

    let dir = TempDir::new("declared-trtllm").unwrap();
    let pool_file = trtllm_pool_file(&dir, engine);
    let mut settings = Settings::for_tests();
    settings.pool_file = Some(pool_file);
    let nats = format!("nats://127.0.0.1:{}", free_port());
    let started = tokio::time::Instant::now();
    let svc = tokio::time::timeout(
        Duration::from_secs(4),
        Service::start(settings, tokenizer(), &nats),
    )
    .await
    .expect("the service starts");

    let verdict = || async {
        let response = route(&svc.base, "chat", Some("trt-1"), body.to_string()).await;
        if response.status() != 200 {
            return Value::Null;
        }
        response.json::<Value>().await.unwrap()
    };
    eventually(
        Duration::from_secs(4),
        "the stored blocks are cached",
        || async {
            verdict().await["cached_tokens"].as_u64() == Some((full_blocks * BLOCK) as u64)
        },
    )
    .await;
    let verdict = verdict().await;
    assert_eq!(
        verdict["cached_tokens"].as_u64(),
        Some((full_blocks * BLOCK) as u64)
    );
    assert_eq!(verdict["engine"], "trtllm", "{verdict}");
    assert_eq!(verdict["decode"]["worker_id"], "trt-0", "{verdict}");
    assert_eq!(verdict["isl"].as_u64(), Some(tokens.len() as u64));

    let workers = svc.get_json("/v1/workers").await;
    let info = &workers["workers"][0]["info"];
    assert_eq!(info["engine"], "trtllm", "{workers}");
    assert_eq!(
        info["kv_capacity_blocks"], 1000,
        "the capacity from kvCacheStats: {workers}"
    );
    assert_eq!(
        workers["workers"][0]["cached_blocks"], full_blocks,
        "{workers}"
    );
    assert!(state.lock().unwrap().polls >= 1);
    assert!(state.lock().unwrap().events.is_empty(), "drained");
    svc.stop().await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "bounded: {:?}",
        started.elapsed()
    );
}

/// An SGLang stand-in: `/health` and its Prometheus gauges. Its address.
async fn start_sglang() -> std::net::SocketAddr {
    let health = warp::get().and(warp::path("health")).map(warp::reply);
    let metrics = warp::get().and(warp::path("metrics")).map(|| {
        "# TYPE sglang:num_running_reqs gauge\n\
         sglang:num_running_reqs{model_name=\"qwen3\"} 0.0\n\
         sglang:num_queue_reqs{model_name=\"qwen3\"} 0.0\n\
         sglang:token_usage{model_name=\"qwen3\"} 0.0\n\
         sglang:max_total_num_tokens{model_name=\"qwen3\"} 32768.0\n"
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(warp::serve(health.or(metrics)).incoming(listener).run());
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_verdicts_name_the_engine_and_the_prefill_workers_bootstrap_port() {
    let (prefill, decode) = (start_sglang().await, start_sglang().await);
    let dir = TempDir::new("declared-sglang").unwrap();
    let pool_file = dir.path().join("pools.yaml");
    // Nothing publishes KV events here: the subscriptions keep trying.
    std::fs::write(
        &pool_file,
        format!(
            "health: {{ interval_ms: 100, timeout_ms: 500 }}\nmetrics: {{ interval_ms: 100 }}\nmodels:\n  - name: qwen3\n    model_dir: {}\n    block_size: {BLOCK}\n    workers:\n      - {{ id: sg-prefill, role: prefill, address: \"{prefill}\", engine: sglang, bootstrap_port: 8998, kv_events: \"tcp://127.0.0.1:{}\" }}\n      - {{ id: sg-decode, role: decode, address: \"{decode}\", engine: sglang, kv_events: \"tcp://127.0.0.1:{}\" }}\n",
            model_dir().display(),
            free_port(),
            free_port(),
        ),
    )
    .unwrap();
    let mut settings = Settings::for_tests();
    settings.pool_file = Some(pool_file);
    let nats = format!("nats://127.0.0.1:{}", free_port());
    let svc = tokio::time::timeout(
        Duration::from_secs(4),
        Service::start(settings, tokenizer(), &nats),
    )
    .await
    .expect("the service starts");
    let cold = json!({"model": "qwen3", "messages": [
        {"role": "user", "content": "Cold prompt about prefix caches and routers. ".repeat(300)}
    ]});
    eventually(
        Duration::from_secs(4),
        "both workers in the pools",
        || async { svc.worker_ids().await.len() == 2 },
    )
    .await;
    let workers = svc.get_json("/v1/workers").await;
    let capacity: Vec<_> = workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["info"]["kv_capacity_blocks"].as_u64())
        .collect();
    assert!(
        capacity.iter().all(|c| *c == Some(32768 / BLOCK as u64)),
        "the capacity from sglang:max_total_num_tokens: {workers}"
    );
    let response = route(&svc.base, "chat", Some("sg-1"), cold.to_string()).await;
    assert_eq!(response.status(), 200);
    let verdict: Value = response.json().await.unwrap();
    assert_eq!(verdict["mode"], "disagg", "{verdict}");
    assert_eq!(verdict["engine"], "sglang", "{verdict}");
    assert_eq!(verdict["decode"]["worker_id"], "sg-decode", "{verdict}");
    assert_eq!(verdict["prefill"]["worker_id"], "sg-prefill", "{verdict}");
    assert_eq!(verdict["prefill"]["bootstrap_port"], 8998, "{verdict}");
    // Healthy workers whose KV event endpoints nobody binds are said and counted, once each:
    // they are routed without their caches (as when engine and pool file both connect).
    // About 7 s on an idle machine (the subscriptions' connect attempts); more under load.
    eventually(
        Duration::from_secs(30),
        "both unreachable publishers counted",
        || async {
            let unreachable = "switchyard_declared_worker_events_total{reason=\"kv_unreachable\"}";
            metric_value(&svc.metrics().await, unreachable) == 2.0
        },
    )
    .await;
    svc.stop().await;
}

/// Heartbeats of a self-registering worker at `port` under the declared `trt-0`'s id, sent until
/// two are counted refused (the consumer's subscription may not have reached NATS yet).
async fn clash_until_refused(svc: &Service, nats: &async_nats::Client, port: u16) {
    let mut clash = worker(
        "trt-0",
        switchyard_protocol::worker::WorkerRole::Agg,
        port,
        7,
    );
    clash.model = "qwen3".into();
    eventually(Duration::from_secs(4), "the clash is counted", || async {
        heartbeat(nats, &clash, 1_000).await;
        nats.flush().await.unwrap();
        metric_value(
            &svc.metrics().await,
            "switchyard_workers_rejected_total{reason=\"declared\"}",
        ) >= 2.0
    })
    .await;
}

/// A self-registering worker under a declared worker's id is refused (counted as `declared`)
/// and the declared worker keeps its registration: before, each replaced the other on every
/// heartbeat and health poll, resetting the worker's cache each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_under_a_declared_workers_id_is_refused_and_counted() {
    let state = Arc::new(Mutex::new(Engine::default()));
    let engine = start_engine(Arc::clone(&state)).await;
    let dir = TempDir::new("declared-clash").unwrap();
    let pool_file = trtllm_pool_file(&dir, engine);
    let mut settings = Settings::for_tests();
    settings.pool_file = Some(pool_file);
    let (_nats_server, svc, nats) = service_with_nats(settings).await;
    let address = |workers: &Value| workers["workers"][0]["info"]["address"].clone();
    eventually(
        Duration::from_secs(4),
        "the declared worker is up",
        || async { address(&svc.get_json("/v1/workers").await) == json!(engine.to_string()) },
    )
    .await;

    clash_until_refused(&svc, &nats, 9050).await;
    let workers = svc.get_json("/v1/workers").await;
    assert_eq!(
        workers["workers"].as_array().map(Vec::len),
        Some(1),
        "{workers}"
    );
    assert_eq!(address(&workers), json!(engine.to_string()), "{workers}");
    svc.stop().await;
}

/// A declared id stays the declared engine's while the pool file names it, healthy or not: a
/// self-registering worker under it is refused even before the engine ever answers a health
/// poll (it would be routed to at its own address under the declared engine's name).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_id_is_refused_to_heartbeats_while_its_engine_is_down() {
    let dir = TempDir::new("declared-down").unwrap();
    let nobody: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let pool_file = trtllm_pool_file(&dir, nobody);
    let mut settings = Settings::for_tests();
    settings.pool_file = Some(pool_file);
    let (_nats_server, svc, nats) = service_with_nats(settings).await;
    clash_until_refused(&svc, &nats, 9051).await;
    let workers = svc.get_json("/v1/workers").await;
    assert_eq!(workers["workers"], json!([]), "{workers}");
    svc.stop().await;
}
