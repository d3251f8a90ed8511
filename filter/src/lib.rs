//! Switchyard's proxy-wasm HTTP filter.
//!
//! For every OpenAI chat/completions request the filter buffers the body, checks it is a
//! request it can route, asks the control plane for a [`switchyard_protocol::route::Verdict`]
//! (`POST /v1/route`, body verbatim; or, with `"tokenize": "filter"`, the prompt's block hashes
//! made in the VM: [`tokenize`]) and names the chosen decode worker in
//! `x-gateway-destination-endpoint`, which Envoy's `envoy.load_balancing_policies.override_host`
//! policy honours. On a `disagg` verdict it first runs the prefill leg on the named prefill
//! worker and hands its `kv_transfer_params` to the decode worker in the body. It reports
//! first bytes and completion back to the control plane in batches. Any failure fails
//! **open**: the request is served anyway (by Envoy's fallback load balancer, or by local
//! prefill on the decode worker), and the reason is counted and shown in the
//! `x-switchyard-route` response header.
//!
//! # Layout
//! - [`config`]: the plugin configuration (JSON) and its validation.
//! - [`request`]: which requests are routed, which client headers are stripped, request ids.
//! - [`body`]: the body check and the prefill/decode body rewrites.
//! - [`verdict`]: the control plane's answer -> a [`verdict::RouteOutcome`].
//! - [`prefill`]: the prefill leg's answer -> the next step (hand off, retry, fall back).
//! - [`outcome`]: how a request was served (the `x-switchyard-route` value).
//! - [`lifecycle`]: the bounded report queue and the `usage` scan of a response's tail.
//! - [`metrics`]: names of the Envoy custom stats the filter keeps.
//! - [`tokenize`]: `"tokenize": "filter"` mode: the per-VM tokenizers and a body turned into
//!   block hashes for the route call.
//! - `root` / `http`: the proxy-wasm contexts (the only code that makes hostcalls), and
//!   `shared`, the per-VM state both use (`root` → `http` → `shared`, never back);
//!   `headers`, the header reads both make, which cannot panic on a value's bytes.
//!
//! Everything but `root`, `http` and `shared` is plain Rust, so native `cargo test` covers it.
#![deny(missing_docs)]

pub mod body;
pub mod config;
mod headers;
mod http;
pub mod lifecycle;
pub mod metrics;
pub mod outcome;
pub mod prefill;
pub mod request;
mod root;
mod shared;
pub mod tokenize;
pub mod verdict;

/// The VM entry point (`_initialize`), in a private module: it is exported to Envoy, not part
/// of the Rust API.
mod entry {
    proxy_wasm::main! {{
        proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
        proxy_wasm::set_root_context(|id| Box::new(crate::root::SwitchyardRoot::new(id)));
    }}
}
