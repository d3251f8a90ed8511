//! Engine adapters for Switchyard: what a real engine publishes, turned into Switchyard's own
//! [`switchyard_protocol::kv`] events, so the router sees one event type whatever the engine.
//!
//! Today that is vLLM's KV-cache events ([`vllm`]), which vLLM publishes over ZMQ in msgpack
//! (SGLang publishes the same framing and msgpack, and is read by the same decoder), and
//! TensorRT-LLM's ([`trtllm`]), which its `trtllm-serve` hands out as JSON when polled.
//! Everything here is pure — bytes in, values out; no sockets, no clock, no async runtime —
//! so the decoders can be fuzzed and the mapping tested on captured payloads. The caller owns
//! the ZMQ sockets and the loop.
//!
//! # Layout
//! - [`vllm::frame`]: one ZMQ message `[topic, seq, msgpack payload]` → [`vllm::VllmBatch`].
//! - [`vllm::encode`]: the reverse, [`vllm::VllmEvent`]s → vLLM's exact bytes (either event
//!   encoding, integer or byte hashes), for simulated workers that speak vLLM's wire.
//! - [`vllm::mapper`]: vLLM events → Switchyard [`KvEvent`](switchyard_protocol::kv::KvEvent)s
//!   carrying Switchyard's sequence hashes, chained across events.
//! - [`vllm::replay`]: vLLM's replay protocol on its ROUTER socket (requests and answers).
//! - [`vllm::sequence`]: a publisher's sequence numbers → in order, gap, duplicate, restart.
//! - [`vllm::block_hash`]: vLLM's byte hashes → the `u64` vLLM itself would publish.
//! - [`trtllm::decode`]: one `POST /kv_cache_events` answer (JSON) → [`trtllm::TrtllmEvent`]s.
//! - [`trtllm::feed`]: a TensorRT-LLM worker's polled events → Switchyard batches, through
//!   the same hash mapper as vLLM's ([`trtllm::mapper`] reshapes the events for it).
//!
//! # Why `rmpv` for msgpack
//! - Pure Rust, maintained in the same project as `rmp` and `rmp-serde` (msgpack-rust), MIT.
//! - [`rmpv::decode::read_value_ref_with_max_depth`] decodes into a *borrowed* tree over the
//!   input slice: strings and byte blobs are not copied.
//! - It is built for hostile input: it never preallocates from a length the input declares
//!   (so a 5-byte "array of 4 billion items" cannot allocate), it has a nesting-depth limit,
//!   and truncation is an error, not a panic.
//! - vLLM's payload has no single schema: events are maps keyed by field name (vLLM 0.32) or
//!   tag-first arrays (older vLLM); hashes are integers or bytes; a hash ≥ 2^63 may arrive as
//!   uint64 or as a negative int64; unknown fields appear as vLLM grows. Looking at each
//!   value's actual msgpack type accepts all of these and names *which field* is wrong in a
//!   typed error. `rmp-serde` would need hand-written visitors or untagged enums (which buffer
//!   and blur errors into strings) for the same result.
//! - The cost: the tree takes memory in proportion to the payload (at worst
//!   `size_of::<rmpv::ValueRef>()`, 32 bytes, per payload byte), so
//!   [`vllm::frame::Limits::max_payload_bytes`] bounds it. A streaming decoder over `rmp`
//!   would avoid the tree, at the price of re-implementing what `rmpv` gets right.
#![deny(missing_docs)]
#![forbid(unsafe_code)]
#![deny(rust_2018_idioms)]
// The decoders face untrusted bytes: no panicking shortcuts in library code.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects
    )
)]

mod outgoing;
pub mod trtllm;
pub mod vllm;
