//! The engine crate's integration tests, one module per subject, linked into one test
//! binary (one link instead of one per file).

mod engine_api;
mod engine_faithfulness;
mod engine_properties;
mod engine_replay;
mod kv_batches;
