//! The simulated worker crate's integration tests, one module per subject, linked into one test
//! binary (one link instead of one per file).

mod worker_support;

mod worker_cli;
mod worker_disconnect;
mod worker_handoff;
mod worker_http;
mod worker_parsing;
mod worker_vllm_wire;
