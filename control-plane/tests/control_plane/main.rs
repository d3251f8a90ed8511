//! The control plane crate's integration tests, one module per subject, linked into one test
//! binary (one link instead of one per file).

mod common;

mod api;
mod cli;
mod conditional;
mod declared_engines;
mod envoy_eds;
mod route_input;
mod service;
