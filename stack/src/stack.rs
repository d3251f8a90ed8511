//! The [`Stack`]: nats-server, the control plane, simulated workers and Envoy on free
//! 127.0.0.1 ports, started in dependency order and stopped in reverse.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use switchyard_protocol::worker::{WorkerId, WorkerRole};

use crate::error::StackError;
use crate::paths::{Artifacts, Profile};
use crate::ports::free_ports;
use crate::running::Stack;

/// The control plane's serving mode (`--serving-mode`); the stack runs `conditional` unless
/// told otherwise.
pub use switchyard_protocol::route::ServingMode;

/// One of the stack's processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    /// nats-server.
    Nats,
    /// The control plane.
    ControlPlane,
    /// The simulated decode and agg workers (one process).
    Workers,
    /// The simulated prefill workers (their own process, so a test can kill the prefill pool
    /// alone); absent when the stack has none.
    PrefillWorkers,
    /// Envoy.
    Envoy,
}

impl Component {
    /// Name used for logs and errors.
    pub fn name(self) -> &'static str {
        match self {
            Component::Nats => "nats-server",
            Component::ControlPlane => "control-plane",
            Component::Workers => "sim-workers",
            Component::PrefillWorkers => "sim-prefill-workers",
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
    decode: usize,
    prefill: usize,
    agg: usize,
    serving_mode: ServingMode,
    conditional_disagg_config: Option<String>,
    listen_port: Option<u16>,
    admin_port: Option<u16>,
    control_plane_port: Option<u16>,
    nats_port: Option<u16>,
    profile: Profile,
    artifacts: Option<Artifacts>,
    run_dir: Option<PathBuf>,
    time_scale: Option<f64>,
    route_timeout_ms: u64,
    envoy_concurrency: u32,
    ready_timeout: Duration,
    keep_logs: bool,
    filter_overrides: serde_json::Map<String, serde_json::Value>,
    plain_listen_port: Option<u16>,
    max_model_len: u32,
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
            nats_port: None,
            profile: Profile::Debug,
            artifacts: None,
            run_dir: None,
            time_scale: None,
            route_timeout_ms: 200,
            envoy_concurrency: 2,
            ready_timeout: Duration::from_secs(60),
            keep_logs: true,
            filter_overrides: serde_json::Map::new(),
            plain_listen_port: None,
            max_model_len: crate::running::MAX_MODEL_LEN,
        }
    }
}

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
    setter!(/// nats-server's port.
        nats_port: u16 => nats_port);
    setter!(/// Which `target/` profile's binaries to run.
        profile: Profile => profile);
    setter!(/// Use these artifacts instead of locating them.
        artifacts: Artifacts => artifacts);
    setter!(/// Where logs and generated config go (default: a new directory under the temp dir).
        run_dir: PathBuf => run_dir);
    setter!(/// The workers' `--time-scale`.
        time_scale: f64 => time_scale);
    setter!(/// The filter's route call timeout.
        route_timeout_ms: u64 => route_timeout_ms);
    setter!(/// Envoy worker threads (each runs its own wasm VM).
        envoy_concurrency: u32 => envoy_concurrency);
    setter!(/// The model's context length, enforced by the control plane and the workers
        /// (default: the simulated Qwen3-235B-A22B's 262,144 tokens).
        max_model_len: u32 => max_model_len);
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

    /// Adds a second Envoy listener on `port` (0: a free one) that routes to the decode
    /// cluster *without* the filter: the baseline of the filter-overhead bench.
    pub fn plain_listener(mut self, port: u16) -> Self {
        self.plain_listen_port = Some(port);
        self
    }

    pub(crate) fn filter_overrides_value(&self) -> &serde_json::Map<String, serde_json::Value> {
        &self.filter_overrides
    }
    pub(crate) fn ready_timeout_value(&self) -> Duration {
        self.ready_timeout
    }
    pub(crate) fn serving_mode_value(&self) -> ServingMode {
        self.serving_mode
    }
    pub(crate) fn conditional_disagg_config_value(&self) -> Option<&str> {
        self.conditional_disagg_config.as_deref()
    }
    pub(crate) fn time_scale_value(&self) -> Option<f64> {
        self.time_scale
    }
    pub(crate) fn route_timeout_value(&self) -> u64 {
        self.route_timeout_ms
    }
    pub(crate) fn envoy_concurrency_value(&self) -> u32 {
        self.envoy_concurrency
    }
    pub(crate) fn max_model_len_value(&self) -> u32 {
        self.max_model_len
    }

    fn workers(&self, ports: &[u16]) -> Vec<WorkerSpec> {
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

    /// Starts every process and waits until requests through Envoy can reach every worker.
    ///
    /// # Errors
    /// A [`StackError`] naming the process or artifact at fault; everything already started
    /// is stopped before this returns.
    pub async fn start(self) -> Result<Stack, StackError> {
        let worker_count = self.decode + self.prefill + self.agg;
        if self.decode + self.agg == 0 {
            return Err(StackError::InvalidSetting(
                "need at least one decode or agg worker".into(),
            ));
        }
        let artifacts = match self.artifacts.clone() {
            Some(a) => a,
            None => Artifacts::locate(self.profile)?,
        };
        let run_dir = match self.run_dir.clone() {
            Some(dir) => dir,
            None => new_run_dir()?,
        };
        std::fs::create_dir_all(&run_dir)
            .map_err(StackError::io(format!("creating {}", run_dir.display())))?;

        let ports = free_ports(5 + worker_count)?;
        let nats_port = self.nats_port.unwrap_or(ports[0]);
        let cp_port = self.control_plane_port.unwrap_or(ports[1]);
        let listen_port = self.listen_port.unwrap_or(ports[2]);
        let admin_port = self.admin_port.unwrap_or(ports[3]);
        let plain_listen_port = self
            .plain_listen_port
            .map(|p| if p == 0 { ports[4] } else { p });
        let workers = self.workers(&ports[5..]);
        let mut stack = Stack {
            processes: Vec::new(),
            run_dir,
            workers,
            nats_port,
            control_plane_port: cp_port,
            listen_port,
            admin_port,
            plain_listen_port,
            client: http_client(),
            remove_run_dir: !self.keep_logs,
            nats_program: artifacts.nats_server.clone(),
            nats_token: switchyard_support::random_token(),
        };
        stack.launch(&self, &artifacts).await?;
        Ok(stack)
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

fn new_run_dir() -> Result<PathBuf, StackError> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let base = std::env::temp_dir();
    for _ in 0..1000 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = base.join(format!("switchyard-run-{}-{n}", std::process::id()));
        if !dir.exists() {
            return Ok(dir);
        }
    }
    Err(StackError::InvalidSetting(format!(
        "no free run directory name under {}",
        base.display()
    )))
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

    #[tokio::test]
    async fn a_stack_without_decode_capacity_is_refused_before_starting_anything() {
        let err = StackBuilder::new()
            .decode_workers(0)
            .prefill_workers(1)
            .start()
            .await
            .unwrap_err();
        assert!(matches!(err, StackError::InvalidSetting(_)), "{err}");
    }
}
