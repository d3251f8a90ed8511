//! The tokenizer crate's integration tests, one module per subject, linked into one test
//! binary (one link instead of one per file).

mod tokenize_cache;
mod tokenize_fixtures;
mod tokenize_requests;
mod tokenize_vllm032;
