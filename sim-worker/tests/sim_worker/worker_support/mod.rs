//! Helpers shared by the worker tests: in-process workers and small HTTP/metrics helpers; a
//! real nats-server (stopped by PID on drop) and free ports come from `switchyard-support`.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use switchyard_protocol::tokenize::{default_model_dir, ModelTokenizer};
use switchyard_protocol::worker::{WorkerId, WorkerRole};
use switchyard_sim_worker::{self as worker, RunningWorker, WorkerConfig, WorkerDeps, WorkerSpec};
pub use switchyard_support::{free_port, NatsServer};

/// The tokenizer the workers use (`scripts/setup.sh` puts it in place).
pub fn tokenizer() -> Arc<ModelTokenizer> {
    let dir = default_model_dir();
    Arc::new(ModelTokenizer::from_dir(&dir).unwrap_or_else(|e| {
        panic!(
            "cannot load the tokenizer from {} ({e}); run scripts/setup.sh",
            dir.display()
        )
    }))
}

/// A worker config on a free port of 127.0.0.1.
pub fn config(role: WorkerRole, id: &str) -> WorkerConfig {
    WorkerConfig::new(WorkerSpec {
        role,
        id: WorkerId(id.to_owned()),
        host: "127.0.0.1".to_owned(),
        port: 0,
    })
}

/// Starts a worker in this process.
pub async fn start(
    cfg: WorkerConfig,
    tokenizer: &Arc<ModelTokenizer>,
    nats: Option<&async_nats::Client>,
) -> RunningWorker {
    let deps = WorkerDeps::new(tokenizer.clone(), nats.cloned());
    worker::start_worker(cfg, deps)
        .await
        .expect("worker starts")
}

/// `http://<addr>`.
pub fn base_url(w: &RunningWorker) -> String {
    format!("http://{}", w.local_addr())
}

/// A chat body whose prompt is long enough for `words` words (about one token each).
pub fn chat_body(topic: &str, words: usize, max_tokens: u32) -> Value {
    let text: Vec<String> = (0..words).map(|i| format!("{topic}{}", i % 97)).collect();
    json!({
        "model": "Qwen/Qwen3-235B-A22B",
        "messages": [
            {"role": "system", "content": "You are a simulated assistant."},
            {"role": "user", "content": text.join(" ")},
        ],
        "max_tokens": max_tokens,
    })
}

/// Reads one sample of `/metrics` text: the value of the line starting with `prefix`
/// (metric name plus the opening of its label set, e.g. `switchyard_kv_pulls_total{`), and
/// containing `label` when given.
pub fn metric(text: &str, name: &str, label: Option<&str>) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| label.is_none_or(|lab| l.contains(lab)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("metric {name} {label:?} not found in:\n{text}"))
}

/// GET `/metrics` of a worker.
pub async fn metrics_text(client: &reqwest::Client, w: &RunningWorker) -> String {
    get(client, w, "/metrics")
        .await
        .text()
        .await
        .expect("metrics body")
}

/// Polls `check` every 20 ms for up to `limit`; true once it holds.
pub async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// The chat completions path.
pub const CHAT: &str = "/v1/chat/completions";
/// The completions path.
pub const COMPLETIONS: &str = "/v1/completions";

/// `POST <worker><path>` with `body` as JSON.
pub async fn post_json(
    client: &reqwest::Client,
    w: &RunningWorker,
    path: &str,
    body: &Value,
) -> reqwest::Response {
    client
        .post(format!("{}{path}", base_url(w)))
        .json(body)
        .send()
        .await
        .expect("worker answers")
}

/// [`post_json`], returning the answer's JSON body whatever its status.
pub async fn post_for_json(
    client: &reqwest::Client,
    w: &RunningWorker,
    path: &str,
    body: &Value,
) -> Value {
    post_json(client, w, path, body)
        .await
        .json()
        .await
        .expect("a JSON answer")
}

/// `GET <worker><path>`.
pub async fn get(client: &reqwest::Client, w: &RunningWorker, path: &str) -> reqwest::Response {
    client
        .get(format!("{}{path}", base_url(w)))
        .send()
        .await
        .expect("worker answers")
}
