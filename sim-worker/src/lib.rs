//! The real-time simulated worker: a vLLM-compatible HTTP server on top of the engine core.
//!
//! **Simulated**: no model runs. Token timing, prefix caching, KV events and the KV handoff
//! come from [`switchyard_engine`]; generated text is filler; KV transfers are waits of the
//! modelled length plus a real HTTP call that releases the prefill worker's blocks. See
//! `docs/sim-worker.md` for flags, API, the handoff protocol and NATS messages.
//!
//! # Layout
//! - [`config`]: `ROLE:ID@HOST:PORT` specs and the per-worker configuration.
//! - [`runtime`]: the task that owns the engine and drives it with a (scaled) clock.
//! - [`http`]: warp routes; [`completion`] serves one OpenAI request; [`stream`] is its SSE
//!   body; [`openai`] holds the request fields and response shapes.
//! - [`handoff`]: the prefill -> decode KV pull (NixlConnector semantics).
//! - [`legs`]: each engine's handoff fields (`--engine vllm|trtllm|sglang`): what a request
//!   asks of the worker's KV, and what a prefill answer says back.
//! - [`kv_sink`]: where the engine task hands its KV events, whichever the wire.
//! - [`nats`]: heartbeats, load reports, KV event batches, resync dumps (the engine crate's
//!   `kv_batches` numbers and splits the batches) — Switchyard's wire.
//! - [`vllm_wire`]: vLLM's wire instead (`--wire vllm`): KV events over ZMQ in vLLM's msgpack,
//!   replay, no NATS.
//! - [`metrics`]: `/metrics` in vLLM's names plus ours.

#![deny(missing_docs)]

pub mod completion;
pub mod config;
pub mod context;
pub mod error;
pub mod fault;
pub mod handoff;
pub mod http;
pub mod kv_sink;
pub mod legs;
pub mod metrics;
pub mod nats;
pub mod openai;
pub mod runtime;
pub mod stream;
pub mod vllm_wire;

use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use switchyard_protocol::registration::RegistrationSecret;
use switchyard_protocol::tokenize::ModelTokenizer;
use switchyard_protocol::worker::WorkerId;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use switchyard_engine::worker_core::WorkerCore;

pub use config::{VllmWireConfig, Wire, WorkerConfig, WorkerSpec, DEFAULT_MODEL_NAME};
pub use error::{ApiError, StartError};
pub use metrics::{PullFailure, WorkerMetrics};
pub use runtime::EngineHandle;

/// What the workers of one process share.
#[derive(Debug, Clone)]
pub struct WorkerDeps {
    /// The prompt tokenizer (block hashes must equal the control plane's).
    pub tokenizer: Arc<ModelTokenizer>,
    /// NATS, if configured (see `switchyard_bus::connect`); `None` runs the worker without it.
    /// Unused by workers on the vLLM wire.
    pub nats: Option<async_nats::Client>,
    /// Client for KV pulls from prefill workers.
    pub http: reqwest::Client,
    /// The registration secret heartbeats are signed with, if the deployment has one.
    pub registration: Option<RegistrationSecret>,
    /// Simulated fault shared by the process's workers: KV events dropped for a while.
    pub kv_outage: Arc<fault::KvOutage>,
}

impl WorkerDeps {
    /// Dependencies with a fresh HTTP client and unsigned heartbeats.
    pub fn new(tokenizer: Arc<ModelTokenizer>, nats: Option<async_nats::Client>) -> Self {
        WorkerDeps {
            tokenizer,
            nats,
            http: reqwest::Client::new(),
            registration: None,
            kv_outage: Arc::default(),
        }
    }

    /// Signs heartbeats with `secret`.
    pub fn with_registration(mut self, secret: Option<RegistrationSecret>) -> Self {
        self.registration = secret;
        self
    }
}

/// A started worker. Dropping it stops the worker (server, engine and NATS tasks).
#[derive(Debug)]
pub struct RunningWorker {
    ctx: Arc<context::WorkerContext>,
    local_addr: SocketAddr,
    vllm_endpoints: Option<(String, Option<String>)>,
    tasks: Vec<JoinHandle<()>>,
    /// The HTTP server: ends once drained (see [`RunningWorker::drain`]).
    server: Option<JoinHandle<()>>,
    /// Tells the HTTP server to stop accepting and finish what it serves.
    stop_accepting: Option<tokio::sync::oneshot::Sender<()>>,
    /// The heartbeat publisher, on Switchyard's wire.
    heartbeats: Option<JoinHandle<()>>,
}

impl RunningWorker {
    /// The worker id.
    pub fn id(&self) -> &WorkerId {
        &self.ctx.id
    }

    /// The bound HTTP address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Random id of this start (heartbeats and KV batches carry it).
    pub fn instance_id(&self) -> u64 {
        self.ctx.instance_id
    }

    /// On the vLLM wire, where its KV event PUB socket listens, port resolved
    /// (`tcp://127.0.0.1:40123`); `None` on Switchyard's wire.
    pub fn kv_events_endpoint(&self) -> Option<&str> {
        self.vllm_endpoints
            .as_ref()
            .map(|(events, _)| events.as_str())
    }

    /// On the vLLM wire, where its replay ROUTER socket listens, if it has one.
    pub fn kv_replay_endpoint(&self) -> Option<&str> {
        self.vllm_endpoints
            .as_ref()
            .and_then(|(_, replay)| replay.as_deref())
    }

    /// The worker's counters.
    pub fn metrics(&self) -> &Arc<WorkerMetrics> {
        &self.ctx.metrics
    }

    /// The engine task.
    pub fn engine(&self) -> &EngineHandle {
        &self.ctx.engine
    }

    /// Stops the engine task alone, as a failure of it would, leaving the HTTP server up
    /// (what `/health` must then report).
    pub fn stop_engine(&mut self) {
        // The engine task is the first one started.
        if let Some(engine) = self.tasks.first() {
            engine.abort();
        }
    }

    /// Stops every task of the worker (in-flight streams end without `[DONE]`).
    pub fn stop(mut self) {
        self.abort_all();
    }

    /// Stops taking requests and lets those in flight finish, for at most `limit`, then stops
    /// every task; returns whether they all finished. Heartbeats stop first, so the control
    /// plane takes the worker out of its pools at its missed-heartbeat limit; the listener
    /// closes, so a new connection is refused and the gateway retries it on another worker;
    /// open streams run to their end. A rolling restart loses nothing this way.
    pub async fn drain(mut self, limit: Duration) -> bool {
        if let Some(heartbeats) = self.heartbeats.take() {
            heartbeats.abort();
        }
        if let Some(stop) = self.stop_accepting.take() {
            let _ = stop.send(());
        }
        let finished = match self.server.take() {
            Some(server) => tokio::time::timeout(limit, server).await.is_ok(),
            None => true,
        };
        self.abort_all();
        finished
    }

    fn abort_all(&mut self) {
        let named = [self.server.take(), self.heartbeats.take()];
        for task in self.tasks.drain(..).chain(named.into_iter().flatten()) {
            task.abort();
        }
    }
}

impl Drop for RunningWorker {
    fn drop(&mut self) {
        self.abort_all();
    }
}

/// A random 64-bit id. std seeds every `RandomState` from the OS, so this needs no RNG crate.
pub fn random_instance_id() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish()
}

/// Binds the worker's port and starts its engine, HTTP server and publishers: NATS on
/// Switchyard's wire (when `deps` has a client), the ZMQ sockets on vLLM's.
///
/// # Errors
/// [`StartError::InvalidConfig`] for a bad configuration, [`StartError::Bind`] when the port
/// cannot be bound, [`StartError::Zmq`] when a vLLM-wire socket cannot be bound.
pub async fn start_worker(
    cfg: WorkerConfig,
    deps: WorkerDeps,
) -> Result<RunningWorker, StartError> {
    cfg.validate().map_err(StartError::InvalidConfig)?;
    let mut engine_cfg = cfg.engine.clone();
    engine_cfg.role = cfg.spec.role;
    engine_cfg
        .validate()
        .map_err(|e| StartError::InvalidConfig(e.to_string()))?;

    let bind = (cfg.spec.host.as_str(), cfg.spec.port);
    let listener = tokio::net::TcpListener::bind(bind)
        .await
        .map_err(|source| StartError::Bind {
            addr: format!("{}:{}", cfg.spec.host, cfg.spec.port),
            source,
        })?;
    let local_addr = listener.local_addr().map_err(|source| StartError::Bind {
        addr: format!("{}:{}", cfg.spec.host, cfg.spec.port),
        source,
    })?;

    let instance_id = random_instance_id();
    let metrics = Arc::new(WorkerMetrics::default());
    let clock = runtime::EngineClock::new(cfg.speed_up);
    let advertised_host = if local_addr.ip().is_unspecified() {
        "127.0.0.1".to_owned() // Bound to all interfaces: loopback is reachable for sure.
    } else {
        cfg.spec.host.clone()
    };
    let info = context::worker_info(
        &cfg.spec.id,
        cfg.spec.role,
        instance_id,
        &cfg.model_name,
        (&advertised_host, local_addr.port()),
        (cfg.engine_kind, &engine_cfg),
    );
    let core = WorkerCore::new(info, engine_cfg.clone())
        .map_err(|e| StartError::InvalidConfig(e.to_string()))?;
    let (sink, wire) = kv_wire(&cfg.wire, &engine_cfg, &metrics).await?;
    let (engine_handle, engine_task) = runtime::spawn_engine(core, clock, sink, metrics.clone());
    let ctx = Arc::new(
        context::WorkerContext::new(
            cfg.spec.id.clone(),
            cfg.spec.role,
            instance_id,
            cfg.model_name.clone(),
            advertised_host,
            local_addr.port(),
            engine_handle,
            engine_cfg,
            clock,
            deps.tokenizer,
            deps.http,
            metrics,
            cfg.max_model_len,
            deps.registration,
        )
        .speaking(cfg.engine_kind, cfg.disagg_request_id)
        .with_faults(fault::Faults::new(cfg.unavailable_every), deps.kv_outage),
    );

    let mut tasks = vec![engine_task];
    let (stop_accepting, accepting_stopped) = tokio::sync::oneshot::channel::<()>();
    // The shared accept loop: TCP_NODELAY, so each streamed token leaves as it is made
    // instead of waiting on the client's delayed ACK.
    let routes = warp::Filter::map(http::routes(ctx.clone()), warp::Reply::into_response);
    let server = switchyard_support::http_server::serve(listener, routes, async {
        let _ = accepting_stopped.await;
    });
    let server = Some(tokio::spawn(server));
    let mut heartbeats = None;
    let mut vllm_endpoints = None;
    match (wire, deps.nats) {
        (KvWire::Nats(kv_rx), Some(client)) => {
            let nats = nats::spawn_nats_tasks(
                ctx.clone(),
                client,
                kv_rx,
                Duration::from_millis(cfg.heartbeat_interval_ms),
                Duration::from_millis(cfg.load_interval_ms),
            );
            heartbeats = Some(nats.heartbeats);
            tasks.extend(nats.others);
        }
        // Without NATS nobody reads the batches; drain them so the engine never counts drops.
        (KvWire::Nats(kv_rx), None) => tasks.push(tokio::spawn(drain(kv_rx))),
        (KvWire::Vllm(parts, steps), _) => {
            let (sockets, vllm) = *parts;
            vllm_endpoints = Some((
                sockets.events_endpoint.clone(),
                sockets.replay_endpoint.clone(),
            ));
            tasks.extend(vllm_wire::spawn(sockets, vllm, steps, ctx.metrics.clone()));
        }
    }
    Ok(RunningWorker {
        ctx,
        local_addr,
        vllm_endpoints,
        tasks,
        server,
        stop_accepting: Some(stop_accepting),
        heartbeats,
    })
}

/// The receiving end of the engine's KV events, per wire.
enum KvWire {
    Nats(mpsc::Receiver<switchyard_protocol::kv::KvEventBatch>),
    // Boxed: the sockets are large, and this lives for one start only.
    Vllm(
        Box<(vllm_wire::BoundSockets, VllmWireConfig)>,
        mpsc::Receiver<vllm_wire::VllmStep>,
    ),
}

/// The engine task's sink for `wire` and what will read from it; vLLM's sockets are bound
/// here, before anything starts, so a bad endpoint fails the start.
async fn kv_wire(
    wire: &Wire,
    engine: &switchyard_engine::EngineConfig,
    metrics: &Arc<WorkerMetrics>,
) -> Result<(Box<dyn kv_sink::KvSink>, KvWire), StartError> {
    match wire {
        Wire::Switchyard => {
            let (tx, rx) = mpsc::channel(runtime::KV_PUBLISH_QUEUE);
            let sink = kv_sink::NatsSink::new(tx, metrics.clone());
            Ok((Box::new(sink), KvWire::Nats(rx)))
        }
        Wire::Vllm(vllm) => {
            let sockets = vllm_wire::bind(vllm).await?;
            let block_size = engine
                .block_size()
                .map_err(|e| StartError::InvalidConfig(e.to_string()))?;
            let book = vllm_wire::BlockBook::new(block_size, engine.hash_seed);
            let (tx, rx) = mpsc::channel(runtime::KV_PUBLISH_QUEUE);
            let sink = vllm_wire::VllmSink::new(book, tx, metrics.clone());
            Ok((
                Box::new(sink),
                KvWire::Vllm(Box::new((sockets, vllm.clone())), rx),
            ))
        }
    }
}

async fn drain<T>(mut rx: mpsc::Receiver<T>) {
    while rx.recv().await.is_some() {}
}
