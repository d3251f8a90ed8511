//! What one simulated worker is: its identity (`ROLE:ID@HOST:PORT`), model and engine.

use std::num::NonZeroU64;
use std::str::FromStr;

use switchyard_protocol::worker::{is_usable_worker_id, MAX_WORKER_ID_LEN};
use switchyard_protocol::worker::{Engine, WorkerId, WorkerRole};

use switchyard_engine::{EngineConfig, SpeedUp};

use crate::legs::DisaggRequestId;

pub use switchyard_engine::{DEFAULT_LOAD_INTERVAL_MS, DEFAULT_MAX_MODEL_LEN, DEFAULT_MODEL_NAME};

pub use crate::vllm_wire::{VllmWireConfig, Wire};

/// One `--worker ROLE:ID@HOST:PORT` flag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSpec {
    /// Prefill, decode or agg.
    pub role: WorkerRole,
    /// Worker id (a valid NATS subject token).
    pub id: WorkerId,
    /// Host to bind and to advertise (heartbeats, `kv_transfer_params.remote_host`).
    pub host: String,
    /// Port to bind; 0 picks a free one (the advertised port is the bound one).
    pub port: u16,
}

/// Why a `--worker` value is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// Not `ROLE:ID@HOST:PORT`.
    #[error("worker spec {0:?} is not ROLE:ID@HOST:PORT (e.g. decode:decode-0@127.0.0.1:8001)")]
    Shape(String),
    /// Unknown role.
    #[error("worker spec {spec:?}: {message}")]
    Role {
        /// The value.
        spec: String,
        /// The role parser's message.
        message: String,
    },
    /// The id cannot be a NATS subject token.
    #[error("worker id {0:?} must be 1 to {MAX_WORKER_ID_LEN} ASCII letters, digits, '-' or '_' (it names NATS subjects)")]
    Id(String),
    /// The port is not a number.
    #[error("worker spec {0:?}: the port must be a number between 0 and 65535")]
    Port(String),
    /// The host is not an IP address.
    #[error("worker spec {0:?}: HOST must be an IP address (it is advertised as the worker's Envoy endpoint, which takes an IP address, not a host name)")]
    Host(String),
}

impl FromStr for WorkerSpec {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let shape = || SpecError::Shape(s.to_owned());
        let (role_id, addr) = s.split_once('@').ok_or_else(shape)?;
        let (role, id) = role_id.split_once(':').ok_or_else(shape)?;
        let (host, port) = addr.rsplit_once(':').ok_or_else(shape)?;
        if host.is_empty() {
            return Err(shape());
        }
        let role = WorkerRole::from_str(role).map_err(|message| SpecError::Role {
            spec: s.to_owned(),
            message,
        })?;
        if !is_usable_worker_id(id) {
            return Err(SpecError::Id(id.to_owned()));
        }
        let port = port.parse().map_err(|_| SpecError::Port(s.to_owned()))?;
        // `[::1]` style hosts are kept without the brackets for binding.
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        if host.parse::<std::net::IpAddr>().is_err() {
            return Err(SpecError::Host(s.to_owned()));
        }
        Ok(WorkerSpec {
            role,
            id: WorkerId(id.to_owned()),
            host,
            port,
        })
    }
}

/// Everything one worker needs besides its shared dependencies.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Identity and address.
    pub spec: WorkerSpec,
    /// Model name (`/v1/models`, response `model` when the request names none, heartbeats).
    pub model_name: String,
    /// The engine core's configuration; its `role` is overwritten by `spec.role`.
    pub engine: EngineConfig,
    /// How many times faster than the modelled hardware the engine runs.
    pub speed_up: SpeedUp,
    /// Interval between heartbeats (ms).
    pub heartbeat_interval_ms: u64,
    /// Interval between load reports (ms).
    pub load_interval_ms: u64,
    /// The model's context length: longer prompts and larger `max_tokens` get a 400.
    pub max_model_len: u32,
    /// Switchyard's NATS wire or vLLM's (ZMQ KV events, no registration).
    pub wire: Wire,
    /// The engine whose handoff protocol the worker speaks (`crate::legs`).
    pub engine_kind: Engine,
    /// A TensorRT-LLM worker: what it makes of a leg's `disagg_request_id`.
    pub disagg_request_id: DisaggRequestId,
    /// Simulated fault for failure tests: answer the 1st, (1+N)th, … completion request 503.
    pub unavailable_every: Option<NonZeroU64>,
}

impl WorkerConfig {
    /// A worker with the default GB200 engine, real-time clock and default intervals.
    pub fn new(spec: WorkerSpec) -> Self {
        WorkerConfig {
            engine: EngineConfig::new(spec.role),
            spec,
            model_name: DEFAULT_MODEL_NAME.to_owned(),
            speed_up: SpeedUp::REAL,
            heartbeat_interval_ms: switchyard_protocol::worker::DEFAULT_HEARTBEAT_INTERVAL_MS,
            load_interval_ms: DEFAULT_LOAD_INTERVAL_MS,
            max_model_len: DEFAULT_MAX_MODEL_LEN,
            wire: Wire::default(),
            engine_kind: Engine::Vllm,
            disagg_request_id: DisaggRequestId::default(),
            unavailable_every: None,
        }
    }

    /// Checks the fields the engine does not check itself.
    ///
    /// # Errors
    /// A message naming the bad field.
    pub fn validate(&self) -> Result<(), String> {
        if self.heartbeat_interval_ms == 0 || self.load_interval_ms == 0 {
            return Err("heartbeat and load intervals must be at least 1 ms".into());
        }
        if self.max_model_len == 0 {
            return Err("max model length must be at least 1 token".into());
        }
        if self.model_name.is_empty() {
            return Err("model name must not be empty".into());
        }
        if !is_usable_worker_id(&self.spec.id.0) {
            return Err(SpecError::Id(self.spec.id.0.clone()).to_string());
        }
        if self.disagg_request_id == DisaggRequestId::Required && self.engine_kind != Engine::Trtllm
        {
            return Err(format!(
                "a disagg_request_id is TensorRT-LLM's; --engine {} workers have none",
                self.engine_kind
            ));
        }
        if let Wire::Vllm(vllm) = &self.wire {
            vllm.validate()?;
            if self.engine_kind != Engine::Vllm {
                return Err(format!(
                    "--wire vllm publishes vLLM's KV events; --engine {} workers use --wire switchyard",
                    self.engine_kind
                ));
            }
        }
        self.engine.validate().map_err(|e| e.to_string())
    }
}
