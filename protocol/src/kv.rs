//! KV cache events: what a worker stores, removes and clears, and how the control plane
//! resynchronises after a gap.
//!
//! A worker publishes [`KvEventBatch`]es on [`crate::subjects::kv_events`]`(worker)` with a
//! per-worker sequence number that increases by one per batch. A receiver that sees a gap (or
//! a worker it has no state for) publishes a [`ResyncRequest`] on
//! [`crate::subjects::kv_resync`]`(worker)`; the worker answers *on its event subject* with a
//! batch whose first event is [`KvEvent::Cleared`] followed by [`KvEvent::Stored`] events for
//! every block it caches (split over several batches of at most
//! [`MAX_BLOCKS_PER_BATCH`] blocks, consecutive sequence numbers), with `resync: true`. Applying
//! batches in order therefore always converges to the worker's true state.

use serde::{Deserialize, Serialize};

use crate::hash::SequenceHash;
use crate::worker::WorkerId;

/// Largest number of blocks in one batch, so batches stay well under NATS's default 1 MiB
/// payload limit.
pub const MAX_BLOCKS_PER_BATCH: usize = 4_096;

/// The engine's own identifier of a cached block (vLLM's block hash, truncated to 64 bits
/// when it arrives as bytes). Removal events name blocks by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EngineBlockId(pub u64);

/// One block a worker has stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredBlock {
    /// Our sequence hash of the block (see [`crate::hash`]).
    pub seq_hash: SequenceHash,
    /// The engine's id for it, used by later removals.
    pub block_id: EngineBlockId,
}

/// One change to a worker's KV cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum KvEvent {
    /// Blocks stored, a contiguous chain continuing after `parent` (`None`: from the prompt's
    /// first block).
    Stored {
        /// Sequence hash of the block before `blocks[0]`, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parent: Option<SequenceHash>,
        /// The engine's id of that block on this worker. With it the KV index finds the
        /// parent without keeping every block's hash in a table (see `switchyard-kv-index`);
        /// an engine that does not send it is indexed correctly, with a table of every hash.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parent_block_id: Option<EngineBlockId>,
        /// The blocks, in prompt order.
        blocks: Vec<StoredBlock>,
        /// Block size in tokens.
        block_size: u32,
    },
    /// Blocks evicted.
    Removed {
        /// Engine ids of the removed blocks.
        block_ids: Vec<EngineBlockId>,
    },
    /// Every block dropped (cache reset, or the start of a resync dump).
    Cleared,
}

/// A batch of events from one worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvEventBatch {
    /// Protocol version.
    #[serde(default = "crate::default_version")]
    pub v: u32,
    /// Which worker.
    pub worker_id: WorkerId,
    /// Process instance (see [`crate::worker::WorkerInfo::instance_id`]); sequence numbers
    /// restart with a new instance.
    pub instance_id: u64,
    /// Per-worker batch number, +1 per batch, starting at 1.
    pub seq: u64,
    /// True for the batches of a resync dump.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub resync: bool,
    /// The events, in order.
    pub events: Vec<KvEvent>,
}

/// Sent by the control plane to ask a worker for a full dump of its cached blocks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResyncRequest {
    /// Protocol version.
    #[serde(default = "crate::default_version")]
    pub v: u32,
    /// Which worker should answer.
    pub worker_id: WorkerId,
    /// Why (`gap`, `new_worker`, ...), for the worker's logs.
    pub reason: String,
}
