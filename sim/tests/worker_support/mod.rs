//! Helpers shared by the worker tests: a real nats-server stopped by PID on drop, in-process
//! workers, and small HTTP/metrics helpers.
#![allow(dead_code)] // Each test file uses a different subset.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use switchyard_protocol::tokenize::{default_model_dir, ModelTokenizer};
use switchyard_protocol::worker::{WorkerId, WorkerRole};
use switchyard_sim::worker::{self, RunningWorker, WorkerConfig, WorkerDeps, WorkerSpec};

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

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port")
}

/// A nats-server with JetStream on a free 127.0.0.1 port, killed (by its PID) on drop.
pub struct NatsServer {
    child: Child,
    /// `nats://127.0.0.1:<port>`.
    pub url: String,
    store: PathBuf,
}

impl NatsServer {
    /// Starts the server on a free port and waits until it accepts connections.
    pub fn start() -> Self {
        Self::start_on(free_port())
    }

    /// Starts the server on `port` and waits until it accepts connections.
    pub fn start_on(port: u16) -> Self {
        let bin = std::env::var_os("SWITCHYARD_NATS_SERVER")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/../.venv/bin/nats-server"
                ))
            });
        assert!(
            bin.exists(),
            "nats-server not found at {} (run scripts/setup.sh or set SWITCHYARD_NATS_SERVER)",
            bin.display()
        );
        let store = std::env::temp_dir().join(format!(
            "switchyard-worker-test-{}-{port}",
            std::process::id()
        ));
        let child = Command::new(&bin)
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(&store)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start nats-server");
        let server = NatsServer {
            child,
            url: format!("nats://127.0.0.1:{port}"),
            store,
        };
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return server;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("nats-server did not listen on port {port} within 5 s");
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.store);
    }
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
    client
        .get(format!("{}/metrics", base_url(w)))
        .send()
        .await
        .expect("metrics answer")
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
