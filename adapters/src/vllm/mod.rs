//! vLLM's KV-cache events, as its ZMQ publisher sends them (`--kv-events-config` with
//! `"publisher": "zmq"`).
//!
//! vLLM publishes one ZMQ multipart message per batch on a PUB socket, `[topic, seq, payload]`:
//! the topic (UTF-8, `""` unless configured), a sequence number (8 bytes, big-endian, +1 per
//! batch from 0 when the engine starts) and a msgpack payload `[ts, events, data_parallel_rank?]`.
//! Each event says a run of blocks was stored, some blocks were removed, or the cache was
//! cleared. A ROUTER socket (`replay_endpoint`) re-sends buffered batches on request.
//!
//! How a caller uses this module, per vLLM publisher (one per data-parallel rank):
//! 1. [`frame::decode_message`] each received message into a [`VllmBatch`];
//! 2. [`sequence::SequenceTracker::observe`] its `seq`: on a gap, ask for a replay
//!    ([`replay`]) and apply the missing batches first;
//! 3. [`mapper::HashMapper::apply_batch`] it, and publish the resulting Switchyard
//!    [`KvEvent`](switchyard_protocol::kv::KvEvent)s; when the mapper says a resync is needed,
//!    replay or clear.
//!
//! [`feed::KvFeed`] does steps 2 and 3 for a caller that owns the sockets. [`encode`] writes
//! the same messages, for anything that must look like a vLLM engine on the wire (the
//! simulated workers' vLLM mode).

pub mod block_hash;
pub mod encode;
pub mod feed;
pub mod frame;
pub mod mapper;
pub mod replay;
pub mod sequence;

mod batch;
mod error;
mod event;
mod fields;
mod names;

pub use batch::{Skipped, VllmBatch, VllmEvent};
pub use error::{DecodeError, EventError, Kind, MsgpackFault};
