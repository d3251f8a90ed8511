//! TensorRT-LLM's KV-cache events, as `trtllm-serve` hands them out on `POST /kv_cache_events`.
//!
//! TensorRT-LLM publishes nothing: a worker started with a nonzero
//! `kv_cache_config.event_buffer_max_size` (and block reuse on) queues its cache events, and
//! each `POST /kv_cache_events` answers with the queued ones as a JSON list and empties the
//! queue. So the caller polls, and every event is seen once. Each event is `{"event_id", "data": {"type", ...}, "window_size",
//! "attention_dp_rank"?}`; `data.type` is `created` (a cache came up), `stored` (a chain of
//! blocks after `parent_hash`, each with its `block_hash` and `tokens[].token_id`), `removed`
//! (`block_hashes`) or `updated` (a block's priority or cache level changed).
//!
//! How a caller uses this module, per worker:
//! 1. [`decode::decode_body`] each answer into [`TrtllmEvent`]s (a malformed event is an error
//!    in its place, not the end of the list);
//! 2. hand them to [`feed::TrtllmFeed::on_poll`] and publish the Switchyard batches it returns.
//!
//! The feed turns TensorRT-LLM's blocks into the same token-keyed chains the vLLM adapter
//! maps ([`mapper::to_mapper_event`], then the vLLM [`HashMapper`](crate::vllm::mapper::HashMapper)):
//! TensorRT-LLM's block hashes, like vLLM's, cannot be computed by the router, but the token
//! ids they carry can.
//!
//! Facts about the format come from TensorRT-LLM's documented serializer and its own
//! KV-cache-aware router; no TensorRT-LLM has been run against this code (see the pool-file
//! docs).

pub mod decode;
pub mod feed;
pub mod mapper;

mod error;
mod event;

pub use error::{DecodeError, EventError};
pub use event::{TrtllmBlock, TrtllmData, TrtllmEvent};
