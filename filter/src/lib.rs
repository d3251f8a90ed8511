//! Switchyard's proxy-wasm HTTP filter.
//!
//! For every OpenAI chat/completions request the filter buffers the body, asks the control
//! plane for a [`switchyard_protocol::route::Verdict`] (`POST /v1/route`, body verbatim) and
//! names the chosen decode worker in `x-gateway-destination-endpoint`, which Envoy's
//! `envoy.load_balancing_policies.override_host` policy honours. Any failure fails **open**:
//! the header stays unset, Envoy's fallback load balancer picks a worker, and the reason is
//! counted and reported in the `x-switchyard-route` response header.
//!
//! # Layout
//! - [`config`]: the plugin configuration (JSON) and its validation.
//! - [`request`]: which requests are routed, which client headers are stripped, request ids.
//! - [`verdict`]: the control plane's answer -> a [`verdict::RouteOutcome`] (pure, no hostcalls).
//! - [`metrics`]: names of the Envoy custom stats the filter keeps.
//! - `root` / `http`: the proxy-wasm contexts (the only code that makes hostcalls).
//!
//! Everything but `root` and `http` is plain Rust, so native `cargo test` covers it.
#![deny(missing_docs)]

pub mod config;
mod http;
pub mod metrics;
pub mod request;
mod root;
pub mod verdict;

/// The VM entry point (`_initialize`), in a private module: it is exported to Envoy, not part
/// of the Rust API.
mod entry {
    proxy_wasm::main! {{
        proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
        proxy_wasm::set_root_context(|id| Box::new(crate::root::SwitchyardRoot::new(id)));
    }}
}
