//! `switchyard-sim-worker`: one or more simulated vLLM-compatible workers in one process.
//!
//! **Simulated**: no model runs; timing comes from the GB200 performance model, text is
//! filler. See `docs/sim-worker.md`.

use std::num::NonZeroU64;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use switchyard_adapters::vllm::encode::{EncodeOptions, EventEncoding, HashEncoding};
use switchyard_bus::{NatsArgs, RegistrationArgs};
use switchyard_engine::{EngineConfig, PerfPreset, SpeedUp, TransferMode};
use switchyard_protocol::tokenize::{default_model_dir, ModelTokenizer};
use switchyard_protocol::worker::Engine;
use switchyard_sim_worker::legs::DisaggRequestId;
use switchyard_sim_worker::vllm_wire::{DEFAULT_BUFFER_STEPS, DEFAULT_TOPIC};
use switchyard_sim_worker::{
    self as worker, VllmWireConfig, Wire, WorkerConfig, WorkerDeps, WorkerSpec, DEFAULT_MODEL_NAME,
};
use switchyard_support::cli::{parse_args, EXIT_USAGE};

/// Simulated vLLM-compatible workers (GB200 performance model) for Switchyard.
#[derive(Debug, Parser)]
#[command(name = "switchyard-sim-worker", version)]
struct Args {
    /// NATS, for heartbeats, load reports and KV events, and its credentials.
    #[command(flatten)]
    nats: NatsArgs,
    /// The registration secret heartbeats are signed with.
    #[command(flatten)]
    registration: RegistrationArgs,
    /// The model's context length in tokens (the simulated Qwen3-235B-A22B's by default).
    #[arg(long, env = "SWITCHYARD_MAX_MODEL_LEN", default_value_t = worker::config::DEFAULT_MAX_MODEL_LEN)]
    max_model_len: u32,
    /// Run without NATS (HTTP only).
    #[arg(long)]
    no_nats: bool,
    /// The protocols besides HTTP: `switchyard` (NATS: registration, load reports, KV event
    /// batches) or `vllm` (like a vLLM worker: no NATS at all, KV events over ZMQ in vLLM's
    /// msgpack with replay, load on /metrics only).
    #[arg(long, env = "SWITCHYARD_WIRE", value_enum, default_value_t = WireArg::Switchyard)]
    wire: WireArg,
    /// vLLM wire: where a worker's KV event PUB socket binds, `tcp://HOST:PORT` (`*` for all
    /// interfaces, port 0 for a free one, logged at start). One per --worker, in order.
    #[arg(
        long = "kv-events-endpoint",
        env = "SWITCHYARD_KV_EVENTS_ENDPOINT",
        value_delimiter = ','
    )]
    kv_events_endpoints: Vec<String>,
    /// vLLM wire: where a worker's replay ROUTER socket binds; none, or one per --worker.
    #[arg(
        long = "kv-replay-endpoint",
        env = "SWITCHYARD_KV_REPLAY_ENDPOINT",
        value_delimiter = ','
    )]
    kv_replay_endpoints: Vec<String>,
    /// vLLM wire: the topic frame of every KV event message (vLLM's `topic`).
    #[arg(long, env = "SWITCHYARD_KV_EVENTS_TOPIC", default_value = DEFAULT_TOPIC)]
    kv_events_topic: String,
    /// vLLM wire: recent batches kept for replay (vLLM's `buffer_steps`).
    #[arg(long, env = "SWITCHYARD_KV_EVENTS_BUFFER_STEPS", default_value_t = DEFAULT_BUFFER_STEPS)]
    kv_events_buffer_steps: usize,
    /// vLLM wire: events as `map`s keyed by field name (vLLM 0.32) or tag-first `array`s
    /// (older vLLM).
    #[arg(long, env = "SWITCHYARD_KV_EVENTS_ENCODING", value_enum, default_value_t = EncodingArg::Map)]
    kv_events_encoding: EncodingArg,
    /// vLLM wire: block hashes as `int`egers (vLLM's default) or 32-byte digests (`bytes`, as
    /// with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0).
    #[arg(long, env = "SWITCHYARD_KV_BLOCK_HASHES", value_enum, default_value_t = HashArg::Int)]
    kv_block_hashes: HashArg,
    /// Hugging Face model folder with tokenizer.json and tokenizer_config.json
    /// (default: `.cache/models/qwen3` in the workspace, from scripts/setup.sh).
    #[arg(long, env = "SWITCHYARD_MODEL_DIR")]
    model_dir: Option<PathBuf>,
    /// Model name served by `/v1/models` and advertised in heartbeats.
    #[arg(long, env = "SWITCHYARD_MODEL_NAME", default_value = DEFAULT_MODEL_NAME)]
    model_name: String,
    /// The engine whose handoff protocol the workers speak: `vllm` (NIXL connector's
    /// `kv_transfer_params`), `trtllm` (`disaggregated_params`, context-only and
    /// generation-only legs) or `sglang` (bootstrap rooms, both legs at once). One for every
    /// worker, or one per `--worker` in order (comma-separated or repeated). Timings are the
    /// same model whatever the engine.
    #[arg(long = "engine", env = "SWITCHYARD_ENGINE", value_delimiter = ',', value_parser = parse_engine)]
    engines: Vec<Engine>,
    /// TensorRT-LLM workers: `refused` (TensorRT-LLM 1.0, whose request models forbid a leg's
    /// `disaggregated_params.disagg_request_id`: 400) or `required` (a newer server moving KV
    /// with the Python transceiver, which needs one on every leg: 500 without).
    #[arg(long, default_value = "refused", value_parser = parse_disagg_request_id)]
    trtllm_disagg_request_id: DisaggRequestId,
    /// A worker to run, `ROLE:ID@HOST:PORT` (role prefill|decode|agg); repeat for several.
    #[arg(long = "worker", required = true, value_parser = parse_spec)]
    workers: Vec<WorkerSpec>,
    /// KV block size in tokens.
    #[arg(long, default_value_t = 64)]
    block_size: u32,
    /// KV capacity in blocks (default: the preset's capacity / block size).
    #[arg(long)]
    kv_capacity_blocks: Option<u64>,
    /// Performance preset: gb200-fp8-tep4, gb200-fp8-dep4, gb200-nvfp4-dep4, h200-fp8-tep8.
    #[arg(long, env = "SWITCHYARD_PERF_PRESET", default_value = "gb200-fp8-tep4", value_parser = parse_preset)]
    perf_preset: PerfPreset,
    /// How many times faster than the modelled hardware the workers run: every iteration,
    /// transfer and lease shrinks by this factor (latencies measured from outside must be
    /// multiplied by it). `--time-scale` is its old name.
    #[arg(long, alias = "time-scale", env = "SWITCHYARD_SPEED_UP", default_value_t = SpeedUp::REAL)]
    speed_up: SpeedUp,
    /// Interval between heartbeats (ms).
    #[arg(long, default_value_t = 1_000)]
    heartbeat_interval_ms: u64,
    /// Interval between load reports (ms).
    #[arg(long, default_value_t = 500)]
    load_interval_ms: u64,
    /// On SIGTERM or Ctrl-C, how long the workers keep serving the requests in flight (they
    /// take no new ones and stop heartbeating at once); a second signal stops them at once.
    /// 0 stops at once.
    #[arg(long, default_value_t = 30_000)]
    drain_timeout_ms: u64,
    /// KV link bandwidth per sending GPU in gigabits/s (default: the preset's link; GB200
    /// NVLink = 7200, an 800G NIC = 800).
    #[arg(long)]
    kv_link_gbps: Option<f64>,
    /// GPUs sending KV in parallel (default: the preset's).
    #[arg(long)]
    kv_senders: Option<u32>,
    /// Achieved share of the link bandwidth.
    #[arg(long)]
    kv_link_efficiency: Option<f64>,
    /// Fixed setup time per KV transfer (ms).
    #[arg(long)]
    kv_setup_ms: Option<f64>,
    /// What a handoff transfers: only the `missing` suffix the decode worker does not cache
    /// (what vLLM's NixlConnector reads), or the `whole` prompt.
    #[arg(long, default_value = "missing", value_parser = parse_transfer_mode)]
    kv_transfer: TransferMode,
    /// How long a prefill worker holds KV nobody pulls (model ms).
    #[arg(long)]
    kv_hold_lease_ms: Option<f64>,
    /// Token budget of one iteration (default: vLLM's 8192 per attention rank).
    #[arg(long)]
    max_num_batched_tokens: Option<u32>,
    /// Most requests running at once (default: vLLM's 256 per attention rank).
    #[arg(long)]
    max_num_seqs: Option<u32>,
    /// Simulated fault, for failure tests: answer the 1st, (1+N)th, (1+2N)th, … completion
    /// request 503 without serving it.
    #[arg(long)]
    unavailable_every: Option<NonZeroU64>,
}

/// `--wire`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum WireArg {
    /// Switchyard's NATS protocol.
    Switchyard,
    /// vLLM's ZMQ KV events and `/metrics`.
    Vllm,
}

/// `--kv-events-encoding`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum EncodingArg {
    /// Maps keyed by field name (vLLM 0.32).
    Map,
    /// Tag-first arrays (older vLLM).
    Array,
}

/// `--kv-block-hashes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum HashArg {
    /// Integers.
    Int,
    /// 32-byte digests.
    Bytes,
}

fn parse_engine(s: &str) -> Result<Engine, String> {
    s.parse()
}

fn parse_disagg_request_id(s: &str) -> Result<DisaggRequestId, String> {
    s.parse()
}

fn parse_spec(s: &str) -> Result<WorkerSpec, String> {
    s.parse()
        .map_err(|e: worker::config::SpecError| e.to_string())
}

fn parse_preset(s: &str) -> Result<PerfPreset, String> {
    s.parse()
}

fn parse_transfer_mode(s: &str) -> Result<TransferMode, String> {
    match s {
        "whole" => Ok(TransferMode::WholePrompt),
        "missing" => Ok(TransferMode::MissingSuffix),
        other => Err(format!(
            "unknown transfer mode {other:?} (expected whole or missing)"
        )),
    }
}

impl Args {
    /// Each worker's wire, in `--worker` order, checked against the endpoint flags.
    fn wires(&self) -> Result<Vec<Wire>, String> {
        let workers = self.workers.len();
        let (events, replays) = (&self.kv_events_endpoints, &self.kv_replay_endpoints);
        if self.wire == WireArg::Switchyard {
            if !events.is_empty() || !replays.is_empty() {
                return Err(
                    "--kv-events-endpoint and --kv-replay-endpoint need --wire vllm".into(),
                );
            }
            return Ok(vec![Wire::Switchyard; workers]);
        }
        if events.len() != workers {
            return Err(format!(
                "--wire vllm needs one --kv-events-endpoint per --worker ({workers} workers, {} endpoints)",
                events.len()
            ));
        }
        if !replays.is_empty() && replays.len() != workers {
            return Err(format!(
                "--kv-replay-endpoint: give none or one per --worker ({workers} workers, {} endpoints)",
                replays.len()
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for endpoint in events.iter().chain(replays) {
            if !endpoint.ends_with(":0") && !seen.insert(endpoint) {
                return Err(format!("KV event endpoint {endpoint} is given twice"));
            }
        }
        let encoding = EncodeOptions {
            events: match self.kv_events_encoding {
                EncodingArg::Map => EventEncoding::Map,
                EncodingArg::Array => EventEncoding::Array,
            },
            hashes: match self.kv_block_hashes {
                HashArg::Int => HashEncoding::Int,
                HashArg::Bytes => HashEncoding::Bytes,
            },
        };
        Ok(events
            .iter()
            .enumerate()
            .map(|(i, endpoint)| {
                let mut cfg = VllmWireConfig::new(endpoint.clone(), replays.get(i).cloned());
                cfg.topic = self.kv_events_topic.clone();
                cfg.buffer_steps = self.kv_events_buffer_steps;
                cfg.encoding = encoding;
                Wire::Vllm(cfg)
            })
            .collect())
    }

    /// Each worker's engine: `--engine` given once (or not: vLLM) for all, or once per worker.
    fn engines(&self) -> Result<Vec<Engine>, String> {
        let workers = self.workers.len();
        match self.engines.as_slice() {
            [] => Ok(vec![Engine::Vllm; workers]),
            [one] => Ok(vec![*one; workers]),
            many if many.len() == workers => Ok(many.to_vec()),
            many => Err(format!(
                "--engine: give one for every worker or one per --worker ({workers} workers, {} engines)",
                many.len()
            )),
        }
    }

    /// The per-worker configurations, checked.
    fn worker_configs(&self) -> Result<Vec<WorkerConfig>, String> {
        let wires = self.wires()?;
        let engines = self.engines()?;
        if self.trtllm_disagg_request_id != DisaggRequestId::default()
            && !engines.contains(&Engine::Trtllm)
        {
            return Err(
                "--trtllm-disagg-request-id: no worker is --engine trtllm (only TensorRT-LLM's legs carry one)"
                    .into(),
            );
        }
        let mut seen_ids = std::collections::HashSet::new();
        let mut seen_ports = std::collections::HashSet::new();
        let mut out = Vec::new();
        for ((spec, wire), engine_kind) in self.workers.iter().zip(wires).zip(engines) {
            if !seen_ids.insert(spec.id.clone()) {
                return Err(format!("worker id {} is given twice", spec.id));
            }
            if spec.port != 0 && !seen_ports.insert((spec.host.clone(), spec.port)) {
                return Err(format!("port {}:{} is given twice", spec.host, spec.port));
            }
            let mut engine = EngineConfig::with_preset(spec.role, self.perf_preset);
            engine.block_size = self.block_size;
            engine.kv_capacity_blocks = match self.kv_capacity_blocks {
                Some(blocks) => blocks,
                None => self.perf_preset.kv_capacity_tokens() / u64::from(self.block_size.max(1)),
            };
            if let Some(gbps) = self.kv_link_gbps {
                engine.transfer.link_gb_per_s = gbps / 8.0;
            }
            if let Some(senders) = self.kv_senders {
                engine.transfer.senders = senders;
            }
            if let Some(eff) = self.kv_link_efficiency {
                engine.transfer.efficiency = eff;
            }
            if let Some(setup) = self.kv_setup_ms {
                engine.transfer.setup_ms = setup;
            }
            engine.transfer.mode = self.kv_transfer;
            if let Some(lease) = self.kv_hold_lease_ms {
                engine.prefill_hold_lease_ms = lease;
            }
            if let Some(n) = self.max_num_batched_tokens {
                engine.max_num_batched_tokens = n;
            }
            if let Some(n) = self.max_num_seqs {
                engine.max_num_seqs = n;
            }
            let cfg = WorkerConfig {
                engine,
                model_name: self.model_name.clone(),
                speed_up: self.speed_up,
                heartbeat_interval_ms: self.heartbeat_interval_ms,
                load_interval_ms: self.load_interval_ms,
                max_model_len: self.max_model_len,
                wire,
                engine_kind,
                disagg_request_id: if engine_kind == Engine::Trtllm {
                    self.trtllm_disagg_request_id
                } else {
                    DisaggRequestId::default()
                },
                unavailable_every: self.unavailable_every,
                spec: spec.clone(),
            };
            cfg.validate()
                .map_err(|e| format!("worker {}: {e}", spec.id))?;
            out.push(cfg);
        }
        Ok(out)
    }
}

/// Targets kept quiet unless `RUST_LOG` names them. warp's server logs every connection that
/// ends early at ERROR, and here that is a client leaving mid-stream: an ordinary event,
/// counted in `switchyard_requests_aborted_total`. async-nats logs every failed reconnect (an
/// ERROR a second while credentials are refused); the bus's event callback says each state
/// once.
const QUIET_LOG_TARGETS: [&str; 2] = ["warp::server", "async_nats"];

fn main() -> ExitCode {
    let rust_log = std::env::var("RUST_LOG").ok();
    let directives = switchyard_support::cli::log_filter(rust_log.as_deref(), &QUIET_LOG_TARGETS);
    // A RUST_LOG the filter cannot parse gets the default, quiet targets included.
    let default = switchyard_support::cli::log_filter(None, &QUIET_LOG_TARGETS);
    tracing_subscriber::fmt()
        // Colour codes only on a terminal: a log file or collector would keep them as text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(directives)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default)),
        )
        .init();
    let args: Args = match parse_args() {
        Ok(parsed) => parsed,
        Err(code) => return code,
    };
    let configs = match args.worker_configs() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    // The NATS servers and the registration secret are flags too: a mistake in them is a
    // usage error, found before anything starts.
    if let Err(e) = switchyard_bus::server_addrs(&args.nats.nats_url) {
        eprintln!("error: {e}");
        return ExitCode::from(EXIT_USAGE);
    }
    if let Err(e) = args.registration.secret() {
        eprintln!("error: {e}");
        return ExitCode::from(EXIT_USAGE);
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // So are the NATS credential and TLS files, read now rather than at the first connect.
    if !(args.no_nats || args.wire == WireArg::Vllm) {
        if let Err(e) = runtime.block_on(args.nats.options("switchyard-sim-worker")) {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    }
    match runtime.block_on(run(args, configs)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", switchyard_support::cli::error_line(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args, configs: Vec<WorkerConfig>) -> anyhow::Result<()> {
    let model_dir = args.model_dir.clone().unwrap_or_else(default_model_dir);
    let tokenizer = tokio::task::spawn_blocking(move || ModelTokenizer::from_dir(&model_dir).map_err(|e| (model_dir, e)))
        .await?
        .map_err(|(dir, e)| {
            anyhow::anyhow!(
                "cannot load the tokenizer from {}: {e} (run scripts/setup.sh or set SWITCHYARD_MODEL_DIR)",
                dir.display()
            )
        })?;
    let registration = args.registration.secret()?;
    // A worker on vLLM's wire never registers: the control plane lists it in a pool file.
    let nats = if args.no_nats || args.wire == WireArg::Vllm {
        None
    } else {
        let client = switchyard_bus::connect(
            &args.nats,
            "switchyard-sim-worker",
            switchyard_bus::log_event,
        )
        .await?;
        if registration.is_none() {
            // Said at start: a worker whose heartbeats are refused looks alive otherwise.
            tracing::warn!("heartbeats are unsigned (no --registration-secret-file): a control plane with a registration secret refuses them, and one without accepts them only with --allow-unsigned-registrations");
        }
        Some(client)
    };
    let deps = WorkerDeps::new(Arc::new(tokenizer), nats).with_registration(registration);
    #[cfg(unix)]
    tokio::spawn(drop_kv_events_on_sigusr1(deps.kv_outage.clone()));
    let mut running = Vec::new();
    for cfg in configs {
        let role = cfg.spec.role;
        let w = worker::start_worker(cfg, deps.clone()).await?;
        tracing::info!(
            "worker {} ({}) listening on {}",
            w.id(),
            role.as_str(),
            w.local_addr()
        );
        if let Some(events) = w.kv_events_endpoint() {
            tracing::info!(
                "worker {} publishes vLLM KV events on {events}, replay on {}",
                w.id(),
                w.kv_replay_endpoint().unwrap_or("(none)")
            );
        }
        running.push(w);
    }
    shutdown_signal().await;
    let limit = Duration::from_millis(args.drain_timeout_ms);
    tracing::info!(
        "draining {} worker(s): no new requests, up to {} ms for those in flight (signal again to stop at once)",
        running.len(),
        limit.as_millis()
    );
    let drained = futures::future::join_all(running.into_iter().map(|w| w.drain(limit)));
    tokio::select! {
        finished = drained => {
            if finished.iter().all(|f| *f) {
                tracing::info!("drained: every request in flight finished");
            } else {
                tracing::warn!("stopped with requests still in flight after {} ms", limit.as_millis());
            }
        }
        () = shutdown_signal() => tracing::warn!("second signal: stopped at once"),
    }
    Ok(())
}

/// How long SIGUSR1 makes the workers drop their KV events.
const KV_OUTAGE: Duration = Duration::from_secs(2);

/// Simulated fault, for the fault drills: on SIGUSR1, every worker of the process drops its
/// KV event batches for [`KV_OUTAGE`] (counted in `switchyard_kv_event_batches_dropped_total`),
/// as a lossy link would; the control plane must notice the gap and ask for a resync.
#[cfg(unix)]
async fn drop_kv_events_on_sigusr1(outage: Arc<switchyard_sim_worker::fault::KvOutage>) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut usr1) = signal(SignalKind::user_defined1()) else {
        tracing::warn!("cannot listen for SIGUSR1: the KV-outage fault is unavailable");
        return;
    };
    while usr1.recv().await.is_some() {
        tracing::warn!(
            seconds = KV_OUTAGE.as_secs(),
            "SIGUSR1: simulated fault, dropping KV events"
        );
        outage.start(tokio::time::Instant::now(), KV_OUTAGE);
    }
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
