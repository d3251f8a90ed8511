//! Shared fixtures of the integration tests: a real `nats-server` on a free loopback port
//! (killed by PID on drop, also on panic) and the control plane started in-process with
//! `service::run_with_tokenizer` on `127.0.0.1:0`.
#![allow(dead_code)] // each test binary uses a different subset

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use switchyard_control_plane::service::tokenizer::PromptTokenizer;
use switchyard_control_plane::settings::Settings;
use switchyard_protocol::worker::{WorkerHeartbeat, WorkerId, WorkerInfo, WorkerRole};

/// A nats-server child process on 127.0.0.1, killed when dropped.
pub struct NatsServer {
    child: Child,
    pub url: String,
    _store: TempDir,
}

/// A scratch directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "switchyard-cp-{tag}-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A port free right now on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind 127.0.0.1:0")
}

fn binary(env: &str, fallback: &str) -> PathBuf {
    let path = std::env::var_os(env).map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join(fallback)
    });
    assert!(
        path.exists(),
        "{} not found at {} (set {env} or run scripts/setup.sh)",
        fallback,
        path.display()
    );
    path
}

impl NatsServer {
    /// Starts `nats-server -js -a 127.0.0.1 -p <free>` and waits until it accepts TCP.
    pub fn start() -> Self {
        Self::start_on(free_port())
    }

    /// Starts it on a given port (for tests that start NATS after the service).
    pub fn start_on(port: u16) -> Self {
        let bin = binary("SWITCHYARD_NATS_SERVER", ".venv/bin/nats-server");
        let store = TempDir::new("nats");
        let child = Command::new(bin)
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(&store.0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nats-server");
        let server = NatsServer {
            child,
            url: format!("nats://127.0.0.1:{port}"),
            _store: store,
        };
        wait_for_tcp(&format!("127.0.0.1:{port}"), Duration::from_secs(10));
        server
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits (bounded) until something accepts TCP connections on `addr`.
pub fn wait_for_tcp(addr: &str, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if std::net::TcpStream::connect(addr).is_ok() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{addr} did not come up in {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The control plane running in-process.
pub struct Service {
    pub addr: SocketAddr,
    pub base: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Service {
    /// Starts `run_with_tokenizer` on 127.0.0.1:0 with `settings`, connected to `nats_url`.
    pub async fn start(
        mut settings: Settings,
        tokenizer: Arc<dyn PromptTokenizer>,
        nats_url: &str,
    ) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        settings.listen = addr;
        settings.shutdown_grace_secs = 2;
        let nats = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connect(nats_url)
            .await
            .expect("nats client");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            switchyard_control_plane::service::run_with_tokenizer(
                settings,
                tokenizer,
                listener,
                nats,
                async move {
                    let _ = stopped.await;
                },
            )
            .await
            .expect("service runs");
        });
        Service {
            addr,
            base: format!("http://{addr}"),
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops the service and waits for it.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .expect("service stops within its grace")
                .expect("service task");
        }
    }

    /// GET a JSON document.
    pub async fn get_json(&self, path: &str) -> serde_json::Value {
        reqwest::get(format!("{}{path}", self.base))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        reqwest::get(format!("{}/metrics", self.base))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Worker ids in `/v1/workers`.
    pub async fn worker_ids(&self) -> Vec<String> {
        let doc = self.get_json("/v1/workers").await;
        doc["workers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["info"]["worker_id"].as_str().unwrap().to_string())
            .collect()
    }
}

/// The value of a metric sample line that starts with `prefix` (e.g. `name{l="v"}`), or 0.
pub fn metric_value(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix) && l[prefix.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Polls `check` every 25 ms until it holds, for at most `limit`.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A worker description.
pub fn worker(id: &str, role: WorkerRole, port: u16, instance: u64) -> WorkerInfo {
    WorkerInfo {
        worker_id: WorkerId(id.to_string()),
        instance_id: instance,
        role,
        address: format!("127.0.0.1:{port}"),
        model: "qwen3".into(),
        block_size: 16,
        kv_capacity_blocks: 10_000,
    }
}

/// Publishes a heartbeat for `info`.
pub async fn heartbeat(nats: &async_nats::Client, info: &WorkerInfo, interval_ms: u64) {
    let hb = WorkerHeartbeat {
        v: 1,
        worker: info.clone(),
        interval_ms,
    };
    nats.publish(
        switchyard_protocol::subjects::HEARTBEAT,
        serde_json::to_vec(&hb).unwrap().into(),
    )
    .await
    .unwrap();
    nats.flush().await.unwrap();
}

/// The model directory the tests tokenize with (`SWITCHYARD_MODEL_DIR` or the workspace's).
pub fn model_dir() -> PathBuf {
    let dir = std::env::var_os("SWITCHYARD_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../.cache/models/qwen3"
            ))
        });
    assert!(
        dir.join("tokenizer.json").exists(),
        "no tokenizer.json in {} (set SWITCHYARD_MODEL_DIR or run scripts/setup.sh)",
        dir.display()
    );
    dir
}

/// The real model tokenizer, loaded once per test binary.
pub fn tokenizer() -> Arc<dyn PromptTokenizer> {
    static TOKENIZER: std::sync::OnceLock<Arc<dyn PromptTokenizer>> = std::sync::OnceLock::new();
    TOKENIZER
        .get_or_init(|| {
            switchyard_control_plane::service::tokenizer::load_model_tokenizer(&model_dir())
                .expect("load the model tokenizer")
        })
        .clone()
}

/// A NATS client for the test's own publishing.
pub async fn client(url: &str) -> async_nats::Client {
    async_nats::connect(url)
        .await
        .expect("connect to test nats-server")
}

/// POSTs `body` to `/v1/route` with the API header and optional request id.
pub async fn route(
    base: &str,
    api: &str,
    request_id: Option<&str>,
    body: impl Into<reqwest::Body>,
) -> reqwest::Response {
    let mut req = reqwest::Client::new()
        .post(format!("{base}/v1/route"))
        .header(switchyard_protocol::route::API_HEADER, api)
        .body(body);
    if let Some(id) = request_id {
        req = req.header(switchyard_protocol::route::REQUEST_ID_HEADER, id);
    }
    req.send().await.expect("route call")
}

/// Heartbeats `info` until the service lists it. The service's consumer subscribes a moment
/// after start, and core NATS drops messages nobody is subscribed to yet.
pub async fn register(
    svc: &Service,
    nats: &async_nats::Client,
    info: &WorkerInfo,
    interval_ms: u64,
) {
    let id = info.worker_id.0.clone();
    eventually(
        Duration::from_secs(10),
        &format!("{id} registered"),
        || async {
            heartbeat(nats, info, interval_ms).await;
            svc.worker_ids().await.contains(&id)
        },
    )
    .await;
}
