//! What a stack is made of, before it runs: the [`StackBuilder`] (workers, serving mode,
//! ports, settings), the [`Component`]s and the [`WorkerSpec`]s. Starting it is
//! [`crate::running`]'s job.

use std::path::PathBuf;
use std::time::Duration;

use switchyard_protocol::worker::{Engine, WorkerId, WorkerRole};

use crate::paths::{Artifacts, Profile};

/// The control plane's serving mode (`--serving-mode`); the stack runs `conditional` unless
/// told otherwise.
pub use switchyard_engine::SpeedUp;
pub use switchyard_protocol::route::ServingMode;

/// One of the stack's processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    /// nats-server.
    Nats,
    /// The control plane (the first replica, when there are several).
    ControlPlane,
    /// A further control-plane replica (1, 2 or 3; see [`StackBuilder::control_planes`]).
    ControlPlaneReplica(u8),
    /// The simulated decode and agg workers (one process).
    Workers,
    /// The simulated prefill workers (their own process, so a test can kill the prefill pool
    /// alone); absent when the stack has none.
    PrefillWorkers,
    /// One decode worker in a process of its own, so a test can kill one decode worker
    /// (see [`StackBuilder::isolate_one_decode_worker`]).
    IsolatedDecodeWorker,
    /// Envoy.
    Envoy,
}

impl Component {
    /// Name used for logs and errors.
    pub fn name(self) -> &'static str {
        match self {
            Component::Nats => "nats-server",
            Component::ControlPlane => "control-plane",
            Component::ControlPlaneReplica(1) => "control-plane-1",
            Component::ControlPlaneReplica(2) => "control-plane-2",
            Component::ControlPlaneReplica(_) => "control-plane-3",
            Component::Workers => "sim-workers",
            Component::PrefillWorkers => "sim-prefill-workers",
            Component::IsolatedDecodeWorker => "sim-decode-worker",
            Component::Envoy => "envoy",
        }
    }
}

/// A simulated worker of the stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSpec {
    /// Its id (`decode-0`, `prefill-1`, `agg-0`, ...).
    pub id: WorkerId,
    /// Its role.
    pub role: WorkerRole,
    /// `127.0.0.1:PORT`.
    pub address: String,
}

impl WorkerSpec {
    /// The `--worker` flag value.
    pub fn flag(&self) -> String {
        format!("{}:{}@{}", self.role.as_str(), self.id, self.address)
    }
}

/// How to bring the stack up. Every port defaults to a free one.
#[derive(Debug, Clone)]
pub struct StackBuilder {
    pub(crate) decode: usize,
    pub(crate) prefill: usize,
    pub(crate) agg: usize,
    pub(crate) serving_mode: ServingMode,
    pub(crate) conditional_disagg_config: Option<String>,
    pub(crate) listen_port: Option<u16>,
    pub(crate) admin_port: Option<u16>,
    pub(crate) control_plane_port: Option<u16>,
    pub(crate) control_plane_admin_port: Option<u16>,
    /// The first simulated worker's port; the others follow it in order.
    pub(crate) first_worker_port: Option<u16>,
    pub(crate) nats_port: Option<u16>,
    pub(crate) profile: Profile,
    pub(crate) artifacts: Option<Artifacts>,
    pub(crate) run_dir: Option<PathBuf>,
    pub(crate) speed_up: Option<SpeedUp>,
    pub(crate) route_timeout_ms: u64,
    pub(crate) envoy_concurrency: u32,
    pub(crate) ready_timeout: Duration,
    pub(crate) keep_logs: bool,
    pub(crate) filter_overrides: serde_json::Map<String, serde_json::Value>,
    pub(crate) plain_listen_port: Option<u16>,
    pub(crate) max_model_len: u32,
    /// The control plane's `--pool-file`, and the workers it declares (not started here).
    pub(crate) pool_file: Option<(PathBuf, Vec<WorkerSpec>)>,
    pub(crate) control_planes: usize,
    pub(crate) isolate_decode: bool,
    /// The engine whose handoff protocol the simulated workers speak.
    pub(crate) engine: Engine,
    /// More flags for every simulated worker process.
    pub(crate) worker_args: Vec<String>,
}

impl Default for StackBuilder {
    fn default() -> Self {
        StackBuilder {
            decode: 2,
            prefill: 0,
            agg: 0,
            serving_mode: ServingMode::Conditional,
            conditional_disagg_config: None,
            listen_port: None,
            admin_port: None,
            control_plane_port: None,
            control_plane_admin_port: None,
            first_worker_port: None,
            nats_port: None,
            profile: Profile::Debug,
            artifacts: None,
            run_dir: None,
            speed_up: None,
            route_timeout_ms: 200,
            envoy_concurrency: 2,
            ready_timeout: Duration::from_secs(60),
            keep_logs: true,
            filter_overrides: serde_json::Map::new(),
            plain_listen_port: None,
            max_model_len: switchyard_engine::DEFAULT_MAX_MODEL_LEN,
            pool_file: None,
            control_planes: 1,
            isolate_decode: false,
            engine: Engine::Vllm,
            worker_args: Vec::new(),
        }
    }
}

/// Most control-plane replicas a local stack runs.
pub const MAX_CONTROL_PLANES: usize = 4;

macro_rules! setter {
    ($(#[$doc:meta])* $name:ident: $ty:ty => $field:ident) => {
        $(#[$doc])*
        pub fn $name(mut self, value: $ty) -> Self {
            self.$field = value.into();
            self
        }
    };
}

impl StackBuilder {
    /// Two decode workers, conditional serving, debug binaries, free ports.
    pub fn new() -> Self {
        Self::default()
    }
    setter!(/// Decode workers.
        decode_workers: usize => decode);
    setter!(/// Prefill workers.
        prefill_workers: usize => prefill);
    setter!(/// Aggregated workers.
        agg_workers: usize => agg);
    setter!(/// `--serving-mode` of the control plane.
        serving_mode: ServingMode => serving_mode);
    setter!(/// `--conditional-disagg-config` JSON.
        conditional_disagg_config: String => conditional_disagg_config);
    setter!(/// Envoy's listener port.
        listen_port: u16 => listen_port);
    setter!(/// Envoy's admin port.
        admin_port: u16 => admin_port);
    setter!(/// The control plane's port.
        control_plane_port: u16 => control_plane_port);
    setter!(/// The control plane's admin port.
        control_plane_admin_port: u16 => control_plane_admin_port);
    setter!(/// The first simulated worker's port: the workers take consecutive ports from it,
        /// decode workers first, then prefill, then aggregated.
        first_worker_port: u16 => first_worker_port);
    setter!(/// nats-server's port.
        nats_port: u16 => nats_port);
    setter!(/// Which `target/` profile's binaries to run.
        profile: Profile => profile);
    setter!(/// Use these artifacts instead of locating them.
        artifacts: Artifacts => artifacts);
    setter!(/// Where logs and generated config go (default: a new directory under the temp dir).
        run_dir: PathBuf => run_dir);
    setter!(/// The workers' `--speed-up` over the modelled hardware.
        speed_up: SpeedUp => speed_up);
    setter!(/// The filter's route call timeout.
        route_timeout_ms: u64 => route_timeout_ms);
    setter!(/// Envoy worker threads (each runs its own wasm VM).
        envoy_concurrency: u32 => envoy_concurrency);
    setter!(/// The model's context length, enforced by the control plane and the workers
        /// (default: the simulated Qwen3-235B-A22B's 262,144 tokens).
        max_model_len: u32 => max_model_len);
    setter!(/// Control-plane replicas, 1 to [`MAX_CONTROL_PLANES`] (default 1). With more than one,
        /// each runs with `--replica-id cp-N` (decisions, lifecycle reports and config shared
        /// over NATS) and Envoy balances route calls across the ready ones.
        control_planes: usize => control_planes);
    setter!(/// Run the last decode worker in a process of its own
        /// ([`Component::IsolatedDecodeWorker`]), so it can be killed alone.
        isolate_one_decode_worker: bool => isolate_decode);
    setter!(/// The engine whose handoff protocol the simulated workers speak (`--engine`;
        /// default vLLM).
        engine: Engine => engine);
    setter!(/// More flags for every simulated worker process (e.g.
        /// `--trtllm-disagg-request-id required`).
        worker_args: Vec<String> => worker_args);
    setter!(/// Budget for each readiness stage.
        ready_timeout: Duration => ready_timeout);
    setter!(/// Keep the run directory when the stack is dropped (default). With `false` it is
        /// removed on a clean drop and kept when the thread is panicking (a failing test
        /// keeps its logs).
        keep_logs: bool => keep_logs);

    /// Sets one key of the filter's JSON configuration (e.g. `max_body_bytes`,
    /// `prefill_timeout_ms`); keys set here win over the stack's defaults. An unknown key makes
    /// the filter, and so Envoy, refuse to start.
    pub fn filter_setting(mut self, key: &str, value: impl Into<serde_json::Value>) -> Self {
        self.filter_overrides.insert(key.to_string(), value.into());
        self
    }

    /// Gives the control plane a pool file declaring `workers` (engines started elsewhere,
    /// such as real vLLM instances). The stack waits until Envoy lists them, as it does for
    /// its own simulated workers; with a pool file, no simulated worker is required.
    pub fn pool_file(mut self, file: PathBuf, workers: Vec<WorkerSpec>) -> Self {
        self.pool_file = Some((file, workers));
        self
    }

    /// Adds a second Envoy listener on `port` (0: a free one) that routes to the decode
    /// cluster *without* the filter: the baseline of the filter-overhead bench.
    pub fn plain_listener(mut self, port: u16) -> Self {
        self.plain_listen_port = Some(port);
        self
    }

    pub(crate) fn workers(&self, ports: &[u16]) -> Vec<WorkerSpec> {
        let roles = [
            (WorkerRole::Decode, self.decode),
            (WorkerRole::Prefill, self.prefill),
            (WorkerRole::Agg, self.agg),
        ];
        let mut ports = ports.iter();
        let mut workers = Vec::new();
        for (role, count) in roles {
            for (index, port) in (0..count).zip(ports.by_ref()) {
                workers.push(WorkerSpec {
                    id: WorkerId(format!("{}-{index}", role.as_str())),
                    role,
                    address: format!("127.0.0.1:{port}"),
                });
            }
        }
        workers
    }
}

/// A reqwest client for loopback calls: never through a proxy from the environment.
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_are_named_by_role_and_get_one_port_each() {
        let builder = StackBuilder::new()
            .decode_workers(2)
            .prefill_workers(1)
            .agg_workers(1);
        let workers = builder.workers(&[9001, 9002, 9003, 9004]);
        let flags: Vec<String> = workers.iter().map(WorkerSpec::flag).collect();
        assert_eq!(
            flags,
            [
                "decode:decode-0@127.0.0.1:9001",
                "decode:decode-1@127.0.0.1:9002",
                "prefill:prefill-0@127.0.0.1:9003",
                "agg:agg-0@127.0.0.1:9004",
            ]
        );
    }
}
