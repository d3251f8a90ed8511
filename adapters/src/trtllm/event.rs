//! The decoded form of TensorRT-LLM's KV-cache events.

use serde::{Deserialize, Serialize};

/// One event of a `POST /kv_cache_events` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrtllmEvent {
    /// +1 per event from the engine's start (per attention-DP rank): gaps and restarts show in it.
    pub event_id: u64,
    /// The attention window the event is about; models with sliding-window layers announce
    /// blocks once per window.
    pub window_size: Option<u64>,
    /// The attention data-parallel rank, when the engine runs several.
    pub attention_dp_rank: Option<i64>,
    /// What happened.
    pub data: TrtllmData,
}

/// What an event says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TrtllmData {
    /// A KV cache was created (the engine started): nothing is cached.
    Created {
        /// Blocks per cache level (GPU first), as the engine sends them.
        num_blocks_per_cache_level: Vec<u64>,
    },
    /// A chain of blocks was stored after `parent_hash`.
    Stored {
        /// The engine's hash of the block before `blocks[0]`; `None` at the prompt's start.
        parent_hash: Option<u64>,
        /// The blocks, in prompt order.
        blocks: Vec<TrtllmBlock>,
    },
    /// Blocks were evicted.
    Removed {
        /// The engine's hashes of the removed blocks.
        block_hashes: Vec<u64>,
    },
    /// A block's priority or cache level changed; the block stays cached.
    Updated {
        /// The block, if the event names one.
        block_hash: Option<u64>,
    },
    /// A type this decoder does not know (kept for its `event_id`).
    Unknown {
        /// The type (shortened to at most 64 bytes).
        kind: String,
    },
}

/// One stored block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrtllmBlock {
    /// The engine's hash of the block and its prefix (64 bits; opaque to Switchyard).
    pub block_hash: u64,
    /// Its token ids; fewer than the block size for the last, partly filled block.
    pub token_ids: Vec<u32>,
    /// The engine hashed more than the token ids, so equal token ids do not mean equal KV:
    /// a token carries a nonzero `token_extra_id` or the block lists `mm_keys` (multimodal
    /// input), or the block has a `cache_salt` (a tenant's cache kept apart).
    pub hashed_with_extra_keys: bool,
}
