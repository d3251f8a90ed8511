//! The vLLM KV-event adapter crate's integration tests, one module per subject, linked into one test
//! binary (one link instead of one per file).

mod common;

mod capture;
mod decode_forms;
mod encode;
mod feed;
mod malformed;
mod mapper;
mod props;
mod replay;
mod sequence;
mod sglang;
