//! The comparison crate's integration tests, one module per subject, linked into one test
//! binary (one link instead of one per file).

mod compare_cli;
mod compare_smoke;
