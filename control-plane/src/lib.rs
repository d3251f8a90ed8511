//! Switchyard control plane: the service that decides, per request, which decode worker
//! serves it and whether a prefill worker computes its KV cache first.
//!
//! The decisions themselves are the pure router core, `switchyard_router` (re-exported here
//! as [`router`] and its modules); this crate is its I/O: it drives the core in real time.
//!
//! # Layout
//! - [`service`]: the task that owns the router core; everyone else sends it commands.
//! - [`api`]: the REST API: the route listener (route, lifecycle, EDS) and the admin listener
//!   (workers, config, status page, behind a token); metrics and health on both.
//! - [`config_version`]: the config's version as an `ETag`, and `If-Match` on changes.
//! - [`consumers`]: NATS subscriptions that decode messages and forward them.
//! - [`metrics`]: Prometheus metrics.
//! - [`models`]: the models served: which one a request names, its tokenizer.
//! - [`eds`]: Envoy endpoint discovery (pool membership).
//! - [`pools`]: declared workers (a pool file): health polls, metrics scrapes, vLLM's ZMQ KV
//!   events.
//! - [`replicas`]: active-active replicas: shared decisions, lifecycle reports and config.
//! - [`readiness`]: `/readyz`, when a (late-joining) replica may be given route calls.
//! - [`settings`]: command-line flags and environment.
//! - [`status`]: the recent verdicts and bypass share the status page shows.
#![deny(missing_docs)]

pub mod api;
pub mod config_version;
pub mod consumers;
pub mod eds;
pub mod metrics;
pub mod models;
pub mod pools;
pub mod readiness;
pub mod replicas;
pub mod service;
pub mod settings;
pub mod status;

pub use switchyard_router as router;
pub use switchyard_router::{config, index, load, policy, predict, select};
