//! The three-mode comparison on the real local stack: aggregated, disaggregated and
//! conditional serving, each on a fresh stack with the same workers (GPUs), the same workload
//! and seed, replayed through Envoy and the filter with the load generator's client.
//!
//! **Simulated workers.** Every latency and throughput comes from the simulated GB200
//! workers' performance model, run `time_scale` times faster than the modelled hardware and
//! converted back (measured × `time_scale`), so the tables are in modelled-hardware time.
//! What is real: nats-server, the control plane's routing, Envoy with the wasm filter, HTTP
//! streaming, and the scheduling noise of this machine.
//!
//! # Layout
//! - [`plan`] (pure): worker split per mode, load levels, labels and scales of every run.
//! - [`workload`]: loading the trace or agentic workload and the request bodies.
//! - [`runner`]: one run (start a stack, wait, replay, stop) and the whole comparison.
//! - [`table`] (pure): the comparison as markdown.
//! - [`output`]: the files written to the output folder.
//! - [`cpu`]: CPU time per stack process and other work on the machine during a run.
//! - [`cross_check`]: the same runs in virtual time ([`switchyard_replay`]) and the
//!   real/virtual ratios of p50 TTFT and ITL.

pub mod cpu;
pub mod cross_check;
pub mod gateway_cost;
pub mod output;
pub mod plan;
pub mod runner;
pub mod table;
pub mod workload;

use std::path::PathBuf;

use serde::Serialize;
use switchyard_loadgen::agentic::AgenticConfig;
use switchyard_loadgen::report::Slo;

use crate::paths::Profile;
use crate::stack::ServingMode;
use crate::StackError;

pub use cross_check::{cross_check_markdown, CrossCheckRow};
pub use plan::{plan_runs, worker_split, RunPlan, WorkerSplit};
pub use runner::{run_comparison, Comparison, ModeRunOutcome};
pub use table::comparison_tables;

/// Where the requests come from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum WorkloadSpec {
    /// A Mooncake trace (JSONL); each row one open-loop request at its timestamp.
    Trace {
        /// The trace file.
        path: PathBuf,
        /// Tokens per trace hash id.
        block_tokens: u32,
    },
    /// Synthetic agentic sessions (closed loop).
    Agentic(AgenticConfig),
}

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
    /// Arrival-rate multipliers (1 = the workload's rate × `1 / arrival_scale`); each mode
    /// runs once per level.
    pub load_levels: Vec<f64>,
    /// The workers' speed-up over the modelled hardware (their `--time-scale`); reported
    /// times are converted back to modelled time.
    pub time_scale: f64,
    /// Multiplies the workload's arrival and think times (0.5 = twice its rate), in
    /// modelled time.
    pub arrival_scale: f64,
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
            load_levels: vec![1.0],
            time_scale: 4.0,
            arrival_scale: 1.0,
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
}

impl CompareError {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CompareError {
        let what = what.into();
        move |source| CompareError::Io { what, source }
    }
}
