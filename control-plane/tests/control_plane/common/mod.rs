//! Shared fixtures of the integration tests (and the `route_latency` bench): the control plane
//! started in-process with `service::run_with_tokenizer` on `127.0.0.1:0`, next to a real
//! `nats-server` on a free loopback port (`switchyard-support`'s fixture, stopped by PID on
//! drop, also on panic).
#![allow(dead_code, unused_imports)] // the bench uses a subset

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
pub use switchyard_support::{free_port, NatsServer, TempDir};

use switchyard_control_plane::service::tokenizer::PromptTokenizer;
use switchyard_control_plane::service::Listeners;
use switchyard_control_plane::settings::{Redacted, Settings};
use switchyard_protocol::worker::{WorkerHeartbeat, WorkerId, WorkerInfo, WorkerRole};

/// Starts a real nats-server, the service with `settings` connected to it, and a NATS client
/// for the test. Bind them in this order (`let (_server, svc, nats) = ...`): locals drop in
/// reverse, so the server stops after its clients.
pub async fn service_with_nats(settings: Settings) -> (NatsServer, Service, async_nats::Client) {
    let server = NatsServer::start();
    let svc = Service::start(settings, tokenizer(), &server.url).await;
    let nats = client(&server.url).await;
    (server, svc, nats)
}

/// The admin token the in-process control plane gets unless a test configures its own.
pub const TEST_ADMIN_TOKEN: &str = "test-admin-token-0123456789";

/// The control plane running in-process.
pub struct Service {
    pub addr: SocketAddr,
    /// The route listener (what Envoy calls).
    pub base: String,
    /// The admin listener (config, workers: behind the admin token).
    pub admin_base: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Service {
    /// Starts `run_with_tokenizer` on 127.0.0.1:0 with `settings`, connected to `nats_url`;
    /// with [`TEST_ADMIN_TOKEN`] as the admin token unless `settings` name one.
    pub async fn start(
        mut settings: Settings,
        tokenizer: Arc<dyn PromptTokenizer>,
        nats_url: &str,
    ) -> Self {
        if settings.admin_token_file.is_none() && settings.admin_token_env.is_none() {
            settings.admin_token_env = Some(Redacted(TEST_ADMIN_TOKEN.into()));
        }
        Self::start_as_configured(settings, tokenizer, nats_url).await
    }

    /// As [`Service::start`], but the admin token is exactly what `settings` say (none, to
    /// test a closed admin API).
    pub async fn start_as_configured(
        mut settings: Settings,
        tokenizer: Arc<dyn PromptTokenizer>,
        nats_url: &str,
    ) -> Self {
        let route = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = route.local_addr().unwrap();
        let admin_addr = admin.local_addr().unwrap();
        settings.listen = addr;
        settings.admin_listen = admin_addr;
        settings.shutdown_grace_secs = 2;
        // Tests register workers with plain heartbeats unless they test signed ones.
        if settings.registration.registration_secret_file.is_none() {
            settings.allow_unsigned_registrations = true;
        }
        // Connected as the binary connects (reconnects at most a second apart).
        let nats = switchyard_bus::connect(
            &switchyard_bus::NatsArgs::plain(nats_url),
            "test-control-plane",
            switchyard_bus::ignore_event,
        )
        .await
        .expect("nats client");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            switchyard_control_plane::service::run_with_tokenizer(
                settings,
                tokenizer,
                Listeners { route, admin },
                nats,
                Box::pin(async move {
                    let _ = stopped.await;
                }),
            )
            .await
            .expect("service runs");
        });
        Service {
            addr,
            base: format!("http://{addr}"),
            admin_base: format!("http://{admin_addr}"),
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

    /// GET a JSON document from the admin listener, with the test admin token (health,
    /// config, workers).
    pub async fn get_json(&self, path: &str) -> serde_json::Value {
        reqwest::Client::new()
            .get(format!("{}{path}", self.admin_base))
            .bearer_auth(TEST_ADMIN_TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// `PUT /v1/config` on the admin listener with the test admin token.
    pub async fn put_config(&self, patch: &serde_json::Value) -> reqwest::Response {
        self.put_config_raw(patch.to_string()).await
    }

    /// `PUT /v1/config` with `body` as it is (JSON or not), with the test admin token.
    pub async fn put_config_raw(&self, body: String) -> reqwest::Response {
        reqwest::Client::new()
            .put(format!("{}/v1/config", self.admin_base))
            .bearer_auth(TEST_ADMIN_TOKEN)
            .header("content-type", "application/json")
            .body(body)
            .send()
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

/// A route and an admin listener on free loopback ports.
pub async fn loopback_listeners() -> Listeners {
    Listeners {
        route: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        admin: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
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

/// Asserts that the metric sample starting with `prefix` in `text` has the value `want`
/// (absent counts as 0, as in [`metric_value`]).
#[track_caller]
pub fn assert_metric(text: &str, prefix: &str, want: f64) {
    assert_eq!(metric_value(text, prefix), want, "{prefix} in:\n{text}");
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
        engine: Default::default(),
        bootstrap_port: None,
    }
}

/// Publishes an unsigned heartbeat for `info` (the test services accept those, see
/// [`Service::start`]).
pub async fn heartbeat(nats: &async_nats::Client, info: &WorkerInfo, interval_ms: u64) {
    publish_heartbeat(
        nats,
        &WorkerHeartbeat {
            v: 1,
            worker: info.clone(),
            interval_ms,
            sent_at_ms: 0,
            signature: None,
        },
    )
    .await;
}

/// Publishes a heartbeat message as it is.
pub async fn publish_heartbeat(nats: &async_nats::Client, hb: &WorkerHeartbeat) {
    nats.publish(
        switchyard_protocol::subjects::HEARTBEAT,
        serde_json::to_vec(hb).unwrap().into(),
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
            switchyard_control_plane::service::tokenizer::load_model_tokenizer(
                &model_dir(),
                switchyard_control_plane::service::tokenizer::DEFAULT_MODEL_DIR_NAMED_BY,
            )
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

/// Registers worker `id` (`127.0.0.1:<port>`, instance 1, a heartbeat interval of a minute, so
/// it stays live for the whole test) and returns it.
pub async fn register_worker(
    svc: &Service,
    nats: &async_nats::Client,
    id: &str,
    role: WorkerRole,
    port: u16,
) -> WorkerInfo {
    let info = worker(id, role, port, 1);
    register(svc, nats, &info, 60_000).await;
    info
}

/// A chat request body with one user message.
pub fn chat(text: &str) -> String {
    json!({"model": "qwen3", "messages": [{"role": "user", "content": text}]}).to_string()
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

pub use switchyard_protocol::registration::unix_now_ms;
