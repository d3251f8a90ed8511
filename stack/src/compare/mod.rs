//! The three-mode comparison on the real local stack: aggregated, disaggregated and
//! conditional serving, each on a fresh stack with the same workers (GPUs), the same workload
//! and seed, replayed through Envoy and the filter with the load generator's client.
//!
//! **Simulated workers.** Every latency and throughput comes from the simulated GB200
//! workers' performance model, run `speed_up` times faster than the modelled hardware and
//! converted back (measured × `speed_up`), so the tables are in modelled-hardware time.
//! What is real: nats-server, the control plane's routing, Envoy with the wasm filter, HTTP
//! streaming, and the scheduling noise of this machine.
//!
//! The plan, the harness, the tables and the plots are the load generator's
//! ([`switchyard_loadgen::compare`]), shared with the virtual-time front end; this module is
//! the real stack's backend and page.
//!
//! # Layout
//! - [`workload`]: loading the trace or agentic workload and the request bodies.
//! - [`real_backend`]: one run (start a stack, wait, replay, stop), the harness's backend.
//! - [`cpu`]: CPU time per stack process and other work on the machine during a run.
//! - [`gateway_cost`]: the gateway's CPU cost per prompt token, for the virtual side.
//! - [`cross_check`]: the same runs in virtual time ([`switchyard_replay`]'s backend) and
//!   the real/virtual ratios of p50 TTFT and ITL.
//! - [`result`]: what a comparison on the real stack produced.
//! - [`output`]: its page and files.
//! - [`runner`]: the whole comparison, in that order.

pub mod cpu;
pub mod cross_check;
pub mod gateway_cost;
pub mod output;
pub mod real_backend;
pub mod result;
pub mod runner;
pub mod workload;

use std::path::PathBuf;

use serde::Serialize;
use switchyard_engine::SpeedUp;
use switchyard_loadgen::agentic::AgenticConfig;
use switchyard_loadgen::compare::{ComparisonPlan, PlanError, PlannedRun, PrefillWorkers};
use switchyard_loadgen::report::Slo;
use switchyard_loadgen::trace_file::TraceForm;
use switchyard_loadgen::{ArrivalScale, LoadLevel};

use crate::paths::Profile;
use crate::stack::ServingMode;
use crate::StackError;

pub use cross_check::{cross_check_markdown, CrossCheckRow};
pub use real_backend::{RealBackend, RealDetail};
pub use result::StackComparison;
pub use runner::run_comparison;

/// Where the requests come from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum WorkloadSpec {
    /// A trace file (JSONL): Mooncake rows, each one open-loop request at its timestamp, or
    /// session rows, closed loop (`docs/loadgen.md`, "Session traces").
    Trace {
        /// The trace file.
        path: PathBuf,
        /// Tokens per trace hash id.
        block_tokens: u32,
        /// The form to read it as; `None`: detected from its first row.
        form: Option<TraceForm>,
    },
    /// Synthetic agentic sessions (closed loop).
    Agentic(AgenticConfig),
}

/// Most workers a comparison starts on the local stack.
pub const MAX_LOCAL_WORKERS: u32 = 128;

/// Everything one comparison depends on. Same values, same workload: a run is reproducible
/// up to the machine's scheduling noise.
#[derive(Debug, Clone)]
pub struct CompareConfig {
    /// The workload.
    pub workload: WorkloadSpec,
    /// Workload seed (prompt contents; agentic structure); also the virtual router's seed.
    pub seed: u64,
    /// Keep only the first N requests (by arrival).
    pub max_requests: Option<usize>,
    /// Workers in every mode (equal GPUs): agg runs them all as agg workers, disagg and
    /// conditional split them into prefill and decode workers.
    pub workers: u32,
    /// Share of the workers that prefill in disagg and conditional mode (rounded, at least
    /// one prefill and one decode worker).
    pub prefill_ratio: f64,
    /// Modes to run, in order.
    pub modes: Vec<ServingMode>,
    /// Offered-load multipliers (2 = twice the load at `arrival_scale`); each mode runs once
    /// per level.
    pub load_levels: Vec<LoadLevel>,
    /// The workers' speed-up over the modelled hardware (their `--speed-up`); reported
    /// times are converted back to modelled time.
    pub speed_up: SpeedUp,
    /// Multiplies the workload's arrival and think times (0.5 = twice its rate), in
    /// modelled time.
    pub arrival_scale: ArrivalScale,
    /// Latency objectives for goodput, modelled ms.
    pub slo: Slo,
    /// `--conditional-disagg-config` JSON for the control plane (and the virtual router).
    pub conditional_disagg_config: Option<String>,
    /// Which `target/` binaries the stacks run.
    pub profile: Profile,
    /// The filter's route call timeout, wall ms. Longer than a production setting: on a
    /// shared 2-core machine, tokenizing a burst of long prompts can take the control plane
    /// past 200 ms, and a fail-open request is routed without the policy being compared.
    pub route_timeout_ms: u64,
    /// Output folder.
    pub out: PathBuf,
    /// Nothing is sent after this many wall seconds of a run.
    pub max_run_s: f64,
    /// Wall seconds in-flight requests get after `max_run_s` before they fail as timeouts.
    pub drain_s: f64,
    /// Per-request limit, wall seconds.
    pub request_timeout_s: f64,
    /// Also replay every run in virtual time and compare (see [`cross_check`]).
    pub cross_check: bool,
    /// Draw the load generator's progress bar (on a terminal).
    pub progress: bool,
}

impl CompareConfig {
    /// The harness's plan: modes × load levels on the configured workers.
    pub fn plan(&self) -> ComparisonPlan {
        ComparisonPlan {
            modes: self.modes.clone(),
            load_levels: self.load_levels.clone(),
            arrival_scale: self.arrival_scale,
            workers: self.workers,
            prefill: PrefillWorkers::Share(self.prefill_ratio),
        }
    }

    /// Checks every setting and returns the runs, before anything starts.
    ///
    /// # Errors
    /// [`CompareError::Plan`] for a plan the harness refuses, [`CompareError::InvalidSetting`]
    /// for the real stack's own limits out of range.
    pub fn validate(&self) -> Result<Vec<PlannedRun>, CompareError> {
        // At most a year: a larger (or infinite) number of seconds is no `Duration`.
        let max = switchyard_support::cli::MAX_SECONDS;
        let positive = |name: &str, x: f64| {
            if x > 0.0 && x <= max {
                Ok(())
            } else {
                Err(CompareError::InvalidSetting(format!(
                    "{name} must be a positive number, got {x}"
                )))
            }
        };
        positive("--max-run-s", self.max_run_s)?;
        positive("--request-timeout-s", self.request_timeout_s)?;
        if !(self.drain_s >= 0.0 && self.drain_s <= max) {
            return Err(CompareError::InvalidSetting(format!(
                "--drain-s must be >= 0, got {}",
                self.drain_s
            )));
        }
        if self.max_requests == Some(0) {
            return Err(CompareError::InvalidSetting(
                "--max-requests must be at least 1".into(),
            ));
        }
        self.router()?;
        if self.workers > MAX_LOCAL_WORKERS {
            return Err(CompareError::InvalidSetting(format!(
                "--workers must be at most {MAX_LOCAL_WORKERS}, got {}: every worker of a local stack is a simulated engine on this machine, with its own port and Envoy endpoint (larger deployments: switchyard-replay, in virtual time)",
                self.workers
            )));
        }
        Ok(self.plan().runs()?)
    }

    /// The router config every run uses, the real runs' control plane and the virtual
    /// cross-check alike: `conditional_disagg_config` with `slo_cost`'s objectives taken from
    /// [`CompareConfig::slo`] unless it names its own, as `switchyard-replay` takes them
    /// ([`switchyard_replay::spec::comparison_router`]): as JSON for the control plane, and
    /// parsed. Before, the real runs decided against `slo_cost`'s default objectives while
    /// being scored against `slo`.
    ///
    /// # Errors
    /// [`CompareError::InvalidSetting`] for a config the router refuses.
    pub fn router(
        &self,
    ) -> Result<(serde_json::Value, switchyard_router::config::RouterConfig), CompareError> {
        switchyard_replay::spec::comparison_router(
            self.conditional_disagg_config.as_deref(),
            self.slo,
        )
        .map_err(CompareError::InvalidSetting)
    }

    /// A comparison of `workload` with the demo's defaults: 4 workers (1 prefill), all three
    /// modes at one load level, workers 4× faster than modelled, debug binaries.
    pub fn new(workload: WorkloadSpec, out: PathBuf) -> Self {
        CompareConfig {
            workload,
            seed: 0,
            max_requests: None,
            workers: 4,
            prefill_ratio: 0.25,
            modes: vec![
                ServingMode::Agg,
                ServingMode::Disagg,
                ServingMode::Conditional,
            ],
            load_levels: vec![LoadLevel::PLANNED],
            // The workers 4× faster than modelled: a fair trade between run time and the
            // gateway's CPU cost per modelled millisecond on a 2-core machine.
            speed_up: SpeedUp::new(4.0).expect("4 is a valid speed-up"),
            arrival_scale: ArrivalScale::PLANNED,
            slo: Slo::default(),
            conditional_disagg_config: None,
            profile: Profile::Debug,
            route_timeout_ms: 1000,
            out,
            max_run_s: 120.0,
            drain_s: 30.0,
            request_timeout_s: 60.0,
            cross_check: false,
            progress: false,
        }
    }
}

/// Why a comparison could not run or finish. Failed *requests* are not errors: they are
/// counted in the reports.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    /// A setting is out of range or inconsistent.
    #[error("invalid comparison setting: {0}")]
    InvalidSetting(String),
    /// The modes, load levels or workers cannot make a comparison.
    #[error("invalid comparison setting: {0}")]
    Plan(#[from] PlanError),
    /// The workload could not be loaded.
    #[error("workload: {0}")]
    Workload(String),
    /// The tokenizer (prompt synthesis, framing) failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A stack did not start.
    #[error("run {label}: the stack did not start: {source}")]
    Stack {
        /// The run.
        label: String,
        /// What failed.
        source: Box<StackError>,
    },
    /// The client could not start a replay.
    #[error("run {label}: {message}")]
    Client {
        /// The run.
        label: String,
        /// What failed.
        message: String,
    },
    /// The virtual-time replay of the cross-check failed.
    #[error("virtual replay {label}: {source}")]
    Virtual {
        /// The run.
        label: String,
        /// What failed.
        source: Box<switchyard_replay::ReplayError>,
    },
    /// Writing results failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being written.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// Writing a run's or the comparison's files failed.
    #[error(transparent)]
    Output(#[from] switchyard_loadgen::compare::output::OutputError),
}

impl CompareError {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CompareError {
        let what = what.into();
        move |source| CompareError::Io { what, source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> CompareConfig {
        CompareConfig::new(
            WorkloadSpec::Trace {
                path: PathBuf::from("t.jsonl"),
                block_tokens: 512,
                form: None,
            },
            PathBuf::from("out"),
        )
    }

    #[test]
    fn bad_settings_are_named() {
        type Breaks = fn(&mut CompareConfig);
        let cases: Vec<(Breaks, &str)> = vec![
            (|c| c.modes.clear(), "no modes"),
            (|c| c.max_requests = Some(0), "--max-requests"),
            (|c| c.max_run_s = 0.0, "--max-run-s"),
            (|c| c.request_timeout_s = f64::NAN, "--request-timeout-s"),
            (|c| c.drain_s = -1.0, "--drain-s"),
            // No `Duration` holds these: refused, not a panic after the stack started.
            (|c| c.max_run_s = 1e300, "--max-run-s"),
            (|c| c.drain_s = f64::INFINITY, "--drain-s"),
            (
                |c| c.modes = vec![ServingMode::Agg, ServingMode::Agg],
                "twice",
            ),
            (|c| c.workers = 1, "at least 2 workers"),
            (
                |c| c.load_levels = [0.5, 1.0, 1.0].map(|x| LoadLevel::new(x).unwrap()).to_vec(),
                "given twice",
            ),
        ];
        for (break_it, needle) in cases {
            let mut c = config();
            break_it(&mut c);
            let message = c.validate().unwrap_err().to_string();
            assert!(message.contains(needle), "{needle}: {message}");
        }
        assert_eq!(config().validate().unwrap().len(), 3);
    }
}
