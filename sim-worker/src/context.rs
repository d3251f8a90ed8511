//! What every request handler of one worker shares.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use switchyard_engine::worker_core::heartbeat;
use switchyard_protocol::hash::{sequence_hashes, SequenceHash};
use switchyard_protocol::registration::RegistrationSecret;
use switchyard_protocol::tokenize::ModelTokenizer;
use switchyard_protocol::worker::{Engine, WorkerHeartbeat, WorkerId, WorkerInfo, WorkerRole};

use switchyard_engine::EngineConfig;
use switchyard_engine::Prompt;

use super::fault::{Faults, KvOutage};
use super::handoff::HoldRegistry;
use super::legs::DisaggRequestId;
use super::metrics::WorkerMetrics;
use super::runtime::{EngineClock, EngineHandle};

/// One worker's shared state (behind an `Arc`).
#[derive(Debug)]
pub struct WorkerContext {
    /// Worker id.
    pub id: WorkerId,
    /// Role.
    pub role: WorkerRole,
    /// The engine whose protocol the worker speaks (`--engine`).
    pub engine_kind: Engine,
    /// A TensorRT-LLM worker: what it makes of a leg's `disagg_request_id`.
    pub disagg_request_id: DisaggRequestId,
    /// Random per start; see [`WorkerInfo::instance_id`].
    pub instance_id: u64,
    /// Served model name.
    pub model_name: String,
    /// Host others reach this worker at.
    pub advertised_host: String,
    /// The bound HTTP port.
    pub port: u16,
    /// The engine task.
    pub engine: EngineHandle,
    /// The engine's configuration (block size, capacity, transfer model).
    pub engine_config: EngineConfig,
    /// Engine time <-> wall time.
    pub clock: EngineClock,
    /// Prompt tokenizer (shared by every worker of the process).
    pub tokenizer: Arc<ModelTokenizer>,
    /// HTTP client for KV pulls.
    pub http: reqwest::Client,
    /// Counters.
    pub metrics: Arc<WorkerMetrics>,
    /// Prefill legs' holds (prefix hashes for the pull check).
    pub holds: HoldRegistry,
    /// The model's context length: longer prompts and larger `max_tokens` get a 400.
    pub max_model_len: u32,
    /// The deployment's registration secret, signing every heartbeat.
    pub registration: Option<RegistrationSecret>,
    /// Simulated faults (failure tests only).
    pub faults: Faults,
    /// Simulated fault: KV events dropped for a while (failure tests only).
    pub kv_outage: Arc<KvOutage>,
    next_request: AtomicU64,
}

impl WorkerContext {
    /// Builds the context; request ids start at 1.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: WorkerId,
        role: WorkerRole,
        instance_id: u64,
        model_name: String,
        advertised_host: String,
        port: u16,
        engine: EngineHandle,
        engine_config: EngineConfig,
        clock: EngineClock,
        tokenizer: Arc<ModelTokenizer>,
        http: reqwest::Client,
        metrics: Arc<WorkerMetrics>,
        max_model_len: u32,
        registration: Option<RegistrationSecret>,
    ) -> Self {
        WorkerContext {
            id,
            role,
            engine_kind: Engine::Vllm,
            disagg_request_id: DisaggRequestId::default(),
            instance_id,
            model_name,
            advertised_host,
            port,
            engine,
            engine_config,
            clock,
            tokenizer,
            http,
            metrics,
            holds: HoldRegistry::default(),
            max_model_len,
            registration,
            faults: Faults::default(),
            kv_outage: Arc::default(),
            next_request: AtomicU64::new(1),
        }
    }

    /// The context of a worker speaking `engine`'s protocol.
    pub fn speaking(mut self, engine: Engine, disagg_request_id: DisaggRequestId) -> Self {
        self.engine_kind = engine;
        self.disagg_request_id = disagg_request_id;
        self
    }

    /// The context with simulated `faults` and `kv_outage` (failure tests only).
    pub fn with_faults(mut self, faults: Faults, kv_outage: Arc<KvOutage>) -> Self {
        self.faults = faults;
        self.kv_outage = kv_outage;
        self
    }

    /// A fresh engine request id.
    pub fn next_request_id(&self) -> u64 {
        self.next_request.fetch_add(1, Ordering::Relaxed)
    }

    /// The engine's prompt for `tokens`: the tokens themselves, or with a `cache_salt` the
    /// blocks' hashes under the salt's own seed, so the prefix cache shares none of them
    /// with another salt's or an unsalted prompt's, as vLLM keys salted blocks apart. (A
    /// prompt given by hashes is not announced on vLLM's wire, where vLLM marks salted
    /// blocks with `extra_keys` and the control plane skips them alike.)
    pub fn engine_prompt(&self, tokens: Vec<u32>, cache_salt: Option<&str>) -> Prompt {
        match (cache_salt, self.engine_config.block_size()) {
            (Some(salt), Ok(block_size)) => Prompt::Hashed {
                tokens: u32::try_from(tokens.len()).unwrap_or(u32::MAX),
                block_hashes: sequence_hashes(
                    &tokens,
                    block_size,
                    self.engine_config.hash_seed.salted(salt),
                ),
            },
            _ => Prompt::Tokens(tokens),
        }
    }

    /// Sequence hash of the last full block of `prompt` under this worker's block size and
    /// seed: it names the whole prefix.
    pub fn prefix_hash(&self, prompt: &Prompt) -> Option<SequenceHash> {
        let block_size = self.engine_config.block_size().ok()?;
        prompt
            .block_hashes(block_size, self.engine_config.hash_seed)
            .last()
            .copied()
    }

    /// `host:port` as heartbeats advertise it.
    pub fn address(&self) -> String {
        address(&self.advertised_host, self.port)
    }

    /// A heartbeat sent at `sent_at_ms` (Unix milliseconds), signed when the worker has the
    /// registration secret.
    pub fn heartbeat(&self, interval_ms: u64, sent_at_ms: u64) -> WorkerHeartbeat {
        let mut hb = heartbeat(&self.info(), interval_ms, sent_at_ms);
        hb.signature = self
            .registration
            .as_ref()
            .map(|secret| secret.sign(&hb.worker, sent_at_ms));
        hb
    }

    /// The registration every heartbeat carries.
    pub fn info(&self) -> WorkerInfo {
        worker_info(
            &self.id,
            self.role,
            self.instance_id,
            &self.model_name,
            (&self.advertised_host, self.port),
            (self.engine_kind, &self.engine_config),
        )
    }
}

/// `host:port`, with an IPv6 host bracketed.
pub fn address(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// What a worker registers as: its identity, address (`host`, `port`), engine kind and
/// engine's block size and capacity. A simulated SGLang prefill worker serves its bootstrap
/// room on its HTTP port (`crate::legs`), so that is its bootstrap port.
pub fn worker_info(
    id: &WorkerId,
    role: WorkerRole,
    instance_id: u64,
    model: &str,
    (host, port): (&str, u16),
    (kind, engine): (Engine, &EngineConfig),
) -> WorkerInfo {
    WorkerInfo {
        worker_id: id.clone(),
        instance_id,
        role,
        address: address(host, port),
        model: model.to_string(),
        block_size: engine.block_size,
        kv_capacity_blocks: engine.kv_capacity_blocks,
        engine: kind,
        bootstrap_port: (kind == Engine::Sglang && role == WorkerRole::Prefill).then_some(port),
    }
}
