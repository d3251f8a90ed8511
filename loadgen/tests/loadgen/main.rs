//! The load generator crate's integration tests, one module per subject, linked into one test
//! binary (one link instead of one per file).

mod loadgen_support;

mod loadgen_agentic;
mod loadgen_cli;
mod loadgen_client;
mod loadgen_prompts;
mod loadgen_report;
mod loadgen_sessions;
mod loadgen_trace;
