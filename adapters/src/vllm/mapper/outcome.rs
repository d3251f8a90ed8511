//! What the mapper makes of each event, and how it is configured.

use switchyard_protocol::hash::{BlockSize, HashSeed};
use switchyard_protocol::kv::{EngineBlockId, KvEvent};

/// How a worker's blocks are hashed and which of its events count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapperConfig {
    /// The worker's KV block size, as registered with the control plane.
    pub block_size: BlockSize,
    /// The seed of Switchyard's hashes (the router hashes prompts with the same).
    pub seed: HashSeed,
    /// The KV cache group to index; vLLM omits `group_idx` for group 0.
    pub group_idx: i64,
    /// The medium to index (`Some("GPU")` by default); events that name another medium are
    /// ignored, events that name none (older vLLM) count. `None` indexes every medium.
    pub medium: Option<String>,
}

impl MapperConfig {
    /// Group 0, medium `"GPU"`, the default seed.
    pub fn new(block_size: BlockSize) -> Self {
        MapperConfig {
            block_size,
            seed: HashSeed::default(),
            group_idx: 0,
            medium: Some("GPU".to_owned()),
        }
    }
}

/// What one vLLM event became.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Publish this event for the worker.
    Forward {
        /// The Switchyard event.
        event: KvEvent,
        /// vLLM's `medium`, passed through.
        medium: Option<String>,
    },
    /// Nothing to publish.
    Ignored(Ignored),
    /// The event continues a block the mapper does not know: events were missed. Nothing was
    /// applied; replay the missed batches or reset.
    ResyncNeeded {
        /// vLLM's hash of the unknown parent.
        missing_parent: EngineBlockId,
    },
}

/// Why an event produced nothing to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ignored {
    /// It belongs to another KV cache group.
    OtherGroup {
        /// Its group.
        group_idx: i64,
    },
    /// It belongs to another medium.
    OtherMedium {
        /// Its medium.
        medium: String,
    },
    /// Its blocks are not identified by their token ids alone (LoRA, extra keys, or such a
    /// parent); they are remembered as not indexed.
    NotTokenKeyed,
    /// A removal of blocks that were never indexed (or are already gone).
    NotIndexed,
    /// A removal of one copy of blocks that the engine still caches in another copy.
    StillCached,
    /// A store of zero blocks.
    Empty,
}

/// A `BlockStored` that contradicts the worker's configuration; nothing was applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    /// The event's block size is not the worker's.
    #[error("the event's block size is {got} tokens, the worker's is {expected}")]
    BlockSizeMismatch {
        /// The worker's (configured).
        expected: u32,
        /// The event's.
        got: u32,
    },
    /// vLLM reports full blocks only: `token_ids` must be `blocks × block_size` long.
    #[error("{tokens} token ids for {blocks} blocks of {block_size} tokens")]
    TokenCountMismatch {
        /// Blocks announced.
        blocks: usize,
        /// Tokens per block.
        block_size: u32,
        /// Token ids given.
        tokens: usize,
    },
}

/// The outcomes of one batch, in event order.
#[derive(Debug, Clone, PartialEq)]
pub struct MappedBatch {
    /// The batch's publisher sequence number.
    pub seq: u64,
    /// The data-parallel rank that published it (one mapper per rank: see the module docs).
    pub data_parallel_rank: Option<i64>,
    /// One result per decoded event.
    pub outcomes: Vec<Result<Outcome, MapError>>,
}

impl MappedBatch {
    /// The Switchyard events to publish, in order.
    pub fn kv_events(&self) -> impl Iterator<Item = &KvEvent> + '_ {
        self.outcomes.iter().filter_map(|o| match o {
            Ok(Outcome::Forward { event, .. }) => Some(event),
            _ => None,
        })
    }

    /// Whether some event asked for a resync.
    pub fn resync_needed(&self) -> bool {
        self.outcomes
            .iter()
            .any(|o| matches!(o, Ok(Outcome::ResyncNeeded { .. })))
    }
}
