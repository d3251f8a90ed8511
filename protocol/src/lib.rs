//! The contract every Switchyard part shares.
//!
//! Switchyard routes OpenAI-style requests behind Envoy: a proxy-wasm filter asks the control
//! plane for a [`route::Verdict`], the control plane keeps a view of every worker's KV cache
//! built from [`kv`] events, [`worker`] heartbeats and load reports that travel over NATS on
//! the [`subjects`] named here. Everything in this crate builds for native targets and for
//! `wasm32-wasip1` (the filter), so it depends on serde and xxhash only; prompt tokenization
//! lives behind the `tokenizer` feature (which builds for `wasm32-wasip1` too: the filter's
//! `tokenize: filter` mode runs it).
//!
//! # Layout
//! - [`hash`]: token ids -> block hashes (the scheme NVIDIA Dynamo's router uses).
//! - [`handoff`]: the prefill -> decode handoff of each engine protocol (vLLM's NIXL).
//! - [`route`]: the route request the filter sends and the verdict it gets back.
//! - [`route_input`]: the compact route input (block hashes, ISL, the fields the control plane
//!   validates) a filter that tokenizes itself sends instead of the body.
//! - [`worker`]: worker identity, registration/heartbeat, load reports.
//! - [`kv`]: KV cache events and resync requests.
//! - [`lifecycle`]: the filter's per-request lifecycle reports.
//! - [`replica`]: what control-plane replicas share (routing decisions, lifecycle reports,
//!   the config bucket).
//! - [`openai`]: the request fields that change what an engine does, validated as vLLM does,
//!   and the OpenAI error a refused request gets.
//! - `registration` (feature `registration`): signed worker registrations.
//! - [`subjects`]: NATS subject names.
//! - `tokenize` (feature `tokenizer`): prompt -> token ids as vLLM computes them (chat
//!   template rendering, HF tokenizer, segment cache).
#![deny(missing_docs)]

pub mod handoff;
pub mod hash;
pub mod kv;
pub mod lifecycle;
pub mod openai;
#[cfg(feature = "registration")]
pub mod registration;
pub mod replica;
pub mod route;
pub mod route_input;
pub mod subjects;
#[cfg(feature = "tokenizer")]
pub mod tokenize;
pub mod worker;

/// Version of the wire messages in this crate. Every message carries it as `v`; a receiver
/// rejects messages from a newer major version it cannot understand.
pub const PROTOCOL_VERSION: u32 = 1;

/// Default for serde: messages without `v` are version 1.
fn default_version() -> u32 {
    PROTOCOL_VERSION
}
