//! A declared TensorRT-LLM worker, against a stand-in `trtllm-serve` (warp on a loopback
//! port) that serves `GET /health`, `GET /metrics` (iteration statistics as JSON) and
//! `POST /kv_cache_events` (drained on read), in the shapes TensorRT-LLM documents. The
//! blocks its events store (token ids from the real Qwen3 tokenizer, block hashes the
//! engine's own) make `/v1/route` report those tokens as cached, and the verdict names the
//! engine. No NATS is needed: the control plane gets a URL nothing listens on.

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
    let pool_file = dir.path().join("pools.yaml");
    std::fs::write(
        &pool_file,
        format!(
            "health: {{ interval_ms: 100, timeout_ms: 500 }}\nmetrics: {{ interval_ms: 100 }}\nmodels:\n  - name: qwen3\n    model_dir: {}\n    block_size: {BLOCK}\n    workers:\n      - {{ id: trt-0, role: agg, address: \"{engine}\", engine: trtllm }}\n",
            model_dir().display()
        ),
    )
    .unwrap();
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
