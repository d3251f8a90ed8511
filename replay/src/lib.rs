//! Virtual-time replay of a workload with the control plane's own routing in the loop.
//!
//! **Simulated.** The real comparison runs a load generator against Envoy, the Switchyard
//! filter, the control plane and simulated workers, in real time. This module replays the
//! same workload through the same decision code without sockets or a wall clock: the control
//! plane's [`Router`](switchyard_router::Router) decides every request at its
//! arrival instant, using exactly the state it would hold then (KV events applied as the
//! engines emit them, load reports at a fixed virtual interval, first-token and done
//! lifecycle reports as they happen), and [`switchyard_engine::vtime::Cluster`] advances the simulated
//! engines ([`switchyard_engine::Engine`]) from event to event. A run is deterministic for a
//! seed, and an hour of Mooncake trace replays in seconds (`docs/virtual-time.md`).
//!
//! What comes out is the load generator's own per-request [`RequestRecord`]s (route = the
//! verdict's mode, worker = the decode worker), so [`switchyard_loadgen::report`] renders real and
//! virtual runs identically, plus one [`RouteNote`] per request with what the router saw
//! (ISL, cached tokens, effective ISL, reason) for threshold tuning.
//!
//! # Layout
//! - [`tokens`]: the exact token ids of a planned request (what the router hashes).
//! - [`spec`]: what a run is given (deployment, router config) and what it returns.
//! - [`gateway`]: the real stack's CPU time before a request reaches an engine (optional).
//! - [`stack`]: the virtual stack: engines + router + the event loop of one run.
//! - [`tracker`]: per-request bookkeeping that turns events into records.
//! - [`modes`]: one serving mode's run and report; the three modes compared.
//! - [`backend`]: the comparison harness's virtual-time backend.
//! - [`sweep`]: conditional-disaggregation threshold sweeps.
//! - [`planner`]: mode, split and thresholds on a GPU budget and SLOs (`switchyard-plan`).
//! - [`ceiling`]: the most goodput any deployment could reach on a workload (bar checks).
//! - [`tuning`]: effective-ISL distributions and the thresholds a sweep measured best.
//! - [`workload`]: the workload a binary's flags describe (trace of either form, agentic).
//!
//! [`RequestRecord`]: switchyard_loadgen::record::RequestRecord

#![deny(missing_docs)]

pub mod backend;
pub mod ceiling;
pub mod gateway;
pub mod modes;
pub mod planner;
pub mod spec;
pub mod stack;
pub mod sweep;
pub mod tokens;
pub mod tracker;
pub mod tuning;
pub mod workload;

#[cfg(test)]
mod tests;

pub use backend::{block_on, VirtualBackend, VirtualDetail};
pub use ceiling::{goodput_ceiling, GoodputCeiling};
pub use gateway::GatewayModel;
pub use modes::{compare_modes, report_run, run_mode, ModeRun};
pub use spec::{ReplayCounters, ReplayRun, StackSpec};
pub use stack::VirtualStack;
pub use sweep::{sweep_markdown, sweep_thresholds, SweepPoint, ThresholdGrid};
pub use tokens::PromptSource;
pub use tracker::RouteNote;
pub use tuning::{
    recommend_from_sweep, recommendation_markdown, tuning_markdown, EffIslDistribution,
    SweepRecommendation,
};

use switchyard_engine::EngineError;

/// Why a replay could not run or finish.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The stack description is unusable (no workers, no decode workers, bad ratio, ...).
    #[error("invalid replay setup: {0}")]
    InvalidSetup(String),
    /// An engine configuration was rejected.
    #[error("engine configuration: {0}")]
    Engine(#[from] EngineError),
    /// The router configuration was rejected.
    #[error("router configuration: {0}")]
    RouterConfig(#[from] switchyard_router::config::ConfigError),
    /// A request id in the workload does not match its position (ids must be `0..n`).
    #[error("workload request at position {position} has id {id}; ids must equal positions")]
    BadRequestId {
        /// Position in the workload.
        position: usize,
        /// The id found there.
        id: usize,
    },
    /// The virtual clock ran past its bound: the simulation stopped making progress.
    #[error("replay did not finish by virtual time {limit_ms} ms ({unfinished} requests open)")]
    DidNotFinish {
        /// The bound.
        limit_ms: f64,
        /// Requests still in flight or waiting.
        unfinished: usize,
    },
}
