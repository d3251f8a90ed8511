//! The decoded form of one vLLM KV event message.

use serde::{Deserialize, Serialize};

/// One ZMQ message from vLLM's KV event publisher: a batch of cache events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VllmBatch {
    /// The ZMQ topic (vLLM's `topic` setting, `""` unless configured).
    pub topic: String,
    /// The publisher's sequence number: +1 per batch, from 0 when the engine starts.
    pub seq: u64,
    /// When vLLM built the batch, in seconds since the Unix epoch (Python's `time.time()`).
    pub ts: f64,
    /// The events, in the engine's order.
    pub events: Vec<VllmEvent>,
    /// The data-parallel rank that published the batch, when vLLM sends one.
    pub data_parallel_rank: Option<i64>,
    /// What the decoder met but did not keep: unknown event types and fields. Kept as notes
    /// rather than errors so that a newer vLLM does not break the stream.
    pub skipped: Vec<Skipped>,
}

/// One change to a vLLM engine's KV cache.
///
/// Hashes are vLLM's own block hashes as `u64` (see [`super::block_hash`] for byte hashes);
/// they name a block *and its prefix* inside vLLM, and are opaque to Switchyard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum VllmEvent {
    /// Full blocks were computed and cached: a chain continuing after `parent`.
    BlockStored {
        /// vLLM's hash of each block, in prompt order.
        block_hashes: Vec<u64>,
        /// vLLM's hash of the block before `block_hashes[0]`; `None` at the prompt's start.
        parent: Option<u64>,
        /// The blocks' token ids, `block_size` per block (vLLM reports full blocks only).
        token_ids: Vec<u32>,
        /// Tokens per block.
        block_size: u32,
        /// The LoRA adapter the blocks were computed with, if any.
        lora_id: Option<i64>,
        /// Where the blocks live (`"GPU"`, `"CPU"` for offloaded copies, ...), when sent.
        medium: Option<String>,
        /// The KV cache group (hybrid models have several), when sent (vLLM 0.32 sends 0 too).
        group_idx: Option<i64>,
        /// True when some block's `extra_keys` is not nil: vLLM mixed more than the token ids
        /// into its hash (multimodal input hashes, a LoRA name, a cache salt, prompt
        /// embeddings), so equal token ids do not mean equal KV.
        hashed_with_extra_keys: bool,
    },
    /// Blocks were evicted.
    BlockRemoved {
        /// vLLM's hashes of the removed blocks.
        block_hashes: Vec<u64>,
        /// Where they lived, when sent.
        medium: Option<String>,
        /// The KV cache group, when sent (vLLM 0.32 sends 0 too).
        group_idx: Option<i64>,
    },
    /// Every cached block was dropped (for example after `POST /reset_prefix_cache`).
    AllBlocksCleared,
}

/// Something the decoder skipped on purpose, reported so the caller can log it.
///
/// `event` is the event's position in the batch's `events` array.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Skipped {
    /// An event whose type tag this decoder does not know; the event was dropped.
    UnknownEventType {
        /// Position in the batch.
        event: usize,
        /// The tag (shortened to at most 64 bytes).
        tag: String,
    },
    /// A field of a map-encoded event that this decoder does not know; it was ignored.
    UnknownField {
        /// Position in the batch.
        event: usize,
        /// The field's name (shortened to at most 64 bytes; non-string keys are described).
        field: String,
    },
    /// An array-encoded event with more items than this decoder knows; they were ignored.
    ExtraArrayItems {
        /// Position in the batch.
        event: usize,
        /// How many trailing items.
        count: usize,
    },
    /// More items in the payload array than `[ts, events, data_parallel_rank]`; ignored.
    ExtraPayloadItems {
        /// How many trailing items.
        count: usize,
    },
}
