//! The one comparison harness: serving modes × load levels on equal workers, run by a
//! [`Backend`] and reported, tabulated and plotted the same way whatever ran them.
//!
//! Two backends exist: virtual time (`switchyard-replay`'s `VirtualBackend`: the engine model
//! and the control plane's core on one event queue) and the real local stack
//! (`switchyard-compare`'s `RealBackend`: nats-server, control plane, simulated workers,
//! Envoy). `switchyard-loadgen compare` renders finished runs with the same table and plots.
//!
//! # Layout
//! - [`plan`] (pure): the runs of a comparison, their worker split and arrival scale.
//! - [`backend`]: what runs one planned run.
//! - [`result`]: what a run and a comparison produced.
//! - [`harness`]: every planned run through one backend, in order.
//! - [`table`] (pure): the comparison as markdown.
//! - [`plot`]: interactivity versus throughput per GPU (SVG).
//! - [`output`]: the files a comparison writes.

pub mod backend;
pub mod harness;
pub mod output;
pub mod plan;
pub mod plot;
pub mod result;
pub mod table;

pub use backend::Backend;
pub use harness::{run_comparison, HarnessError};
pub use plan::{worker_split, ComparisonPlan, PlanError, PlannedRun, PrefillWorkers, WorkerSplit};
pub use result::{Comparison, RunDetail, RunResult};
pub use table::{comparison_tables, headline_table};
