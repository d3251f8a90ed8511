//! Switchyard control plane: decides, per request, which decode worker serves it and
//! whether a prefill worker computes its KV cache first.
//!
//! # Layout
//! Pure logic (no I/O, time and randomness passed in):
//! - [`router`]: the routing state machine the service and the simulator drive.
//! - [`index`]: which workers cache which block sequences.
//! - [`load`]: predicted and reported load per worker.
//! - [`predict`]: blocks just routed to a worker, counted as cached until its events tell.
//! - [`select`]: choosing decode and prefill workers by cost.
//! - [`policy`]: the conditional-disaggregation rules (bypass or disaggregate).
//! - [`config`]: runtime configuration, validated.
//!
//! Service (I/O):
//! - [`service`]: the task that owns the router; everyone else sends it commands.
//! - [`api`]: the REST API (route, workers, config, lifecycle, EDS, metrics, health).
//! - [`consumers`]: NATS subscriptions that decode messages and forward them.
//! - [`metrics`]: Prometheus metrics.
//! - [`eds`]: Envoy endpoint discovery (pool membership).
//! - [`settings`]: command-line flags and environment.
#![deny(missing_docs)]

pub mod api;
pub mod config;
pub mod consumers;
pub mod eds;
pub mod index;
pub mod load;
pub mod metrics;
pub mod policy;
pub mod predict;
pub mod router;
pub mod select;
pub mod service;
pub mod settings;
