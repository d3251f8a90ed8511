//! Brings a whole local Switchyard up on 127.0.0.1 and takes it down again.
//!
//! [`StackBuilder::start`] starts nats-server, the control plane, the simulated workers (one
//! process, several `--worker`s) and Envoy with the Switchyard filter, each on a free port,
//! and returns once a request through Envoy can reach every worker (Envoy's EDS lists them
//! all as healthy). Every process's output goes to a log file in the run directory. The
//! returned [`Stack`] stops every process by PID when dropped, also when a test panics. It is
//! the parent of every process, so it must stay alive as long as they should run (Envoy
//! started by a script that exits gets SIGTERM).
//!
//! # Layout
//! - [`stack`]: what a stack is made of: the builder, components, worker specs.
//! - [`running`]: starting a built stack ([`StackBuilder::start`]) and the running [`Stack`]:
//!   start order, readiness, accessors, stopping.
//! - [`envoy`]: bootstrap rendering and the admin `/clusters` reader (pure).
//! - [`process`]: one supervised child (log file, signals, stop on drop).
//! - [`cleanup`]: stopping every child on SIGINT/SIGTERM (opt-in, for test processes).
//! - [`readiness`]: bounded polling.
//! - [`paths`]: where binaries are, and the commands that build them.
//! - [`error`]: why starting or running a stack failed ([`StackError`]).
//! - [`compare`]: the serving-mode comparison on real stacks (the `switchyard-compare`
//!   binary).
//!
//! Arrows go one way: `running` → `stack`, `process` → `cleanup`.
#![deny(missing_docs)]

pub mod cleanup;
pub mod compare;
pub mod envoy;
pub mod error;
pub mod paths;
pub mod process;
pub mod readiness;
pub mod running;
pub mod stack;

pub use cleanup::stop_children_on_signal;
pub use error::StackError;
pub use paths::{Artifacts, Profile};
pub use process::Signal;
pub use running::{Stack, ADMIN_TOKEN_FILE, ENVOY_ADMIN_TIMEOUT};
pub use stack::{
    http_client, Component, ServingMode, SpeedUp, StackBuilder, WorkerSpec, MAX_CONTROL_PLANES,
};
/// The model the stack's simulated workers serve (their `--model-name` default).
pub use switchyard_engine::DEFAULT_MODEL_NAME as SIMULATED_MODEL;
