//! Engine KV events -> numbered [`KvEventBatch`]es, and resync dumps (pure; no I/O).
//!
//! One [`KvBatcher`] per worker owns the sequence counter, so step batches and resync dumps
//! share one gap-free numbering: a dump is `Cleared` followed by `Stored` chains, `resync:
//! true`, on consecutive sequence numbers, exactly as `protocol/src/kv.rs` specifies. Every
//! batch carries at most [`MAX_BLOCKS_PER_BATCH`] blocks; a larger event is split (a `Stored`
//! chain continues from the last block of the previous piece).

use std::collections::HashMap;

use switchyard_protocol::hash::SequenceHash;
use switchyard_protocol::kv::{
    EngineBlockId, KvEvent, KvEventBatch, StoredBlock, MAX_BLOCKS_PER_BATCH,
};
use switchyard_protocol::worker::WorkerId;
use switchyard_protocol::PROTOCOL_VERSION;

/// Numbers one worker's KV event batches.
#[derive(Debug, Clone)]
pub struct KvBatcher {
    worker_id: WorkerId,
    instance_id: u64,
    block_size: u32,
    next_seq: u64,
    max_blocks: usize,
}

impl KvBatcher {
    /// A batcher whose first batch gets sequence number 1.
    pub fn new(worker_id: WorkerId, instance_id: u64, block_size: u32) -> Self {
        KvBatcher {
            worker_id,
            instance_id,
            block_size,
            next_seq: 1,
            max_blocks: MAX_BLOCKS_PER_BATCH,
        }
    }

    /// Same, with a smaller per-batch block limit (tests exercise splitting with it).
    pub fn with_max_blocks(mut self, max_blocks: usize) -> Self {
        self.max_blocks = max_blocks.max(1);
        self
    }

    /// Sequence number the next batch will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The events of one engine step as batches (none when there are no events).
    pub fn batch_events(&mut self, events: Vec<KvEvent>) -> Vec<KvEventBatch> {
        self.pack(events, false)
    }

    /// A full dump: `Cleared`, then every cached block as `Stored` chains. `blocks` must list
    /// parents before children, as [`crate::Engine::cached_blocks`] does.
    pub fn resync_dump(
        &mut self,
        blocks: Vec<(Option<SequenceHash>, StoredBlock)>,
    ) -> Vec<KvEventBatch> {
        let mut events = vec![KvEvent::Cleared];
        // Each chain's parent by its engine id too, when the dump has it (see
        // `KvEvent::Stored::parent_block_id`).
        let ids: HashMap<SequenceHash, EngineBlockId> = blocks
            .iter()
            .map(|(_, b)| (b.seq_hash, b.block_id))
            .collect();
        let mut chain: Vec<StoredBlock> = Vec::new();
        let mut chain_parent: Option<SequenceHash> = None;
        for (parent, block) in blocks {
            // Extend the current chain when this block continues it; start a new one otherwise.
            let continues = chain
                .last()
                .map(|b| Some(b.seq_hash) == parent)
                .unwrap_or(false);
            if !continues && !chain.is_empty() {
                let parent_id = chain_parent.and_then(|p| ids.get(&p).copied());
                events.push(self.stored(chain_parent, parent_id, std::mem::take(&mut chain)));
            }
            if chain.is_empty() {
                chain_parent = parent;
            }
            chain.push(block);
        }
        if !chain.is_empty() {
            let parent_id = chain_parent.and_then(|p| ids.get(&p).copied());
            events.push(self.stored(chain_parent, parent_id, chain));
        }
        self.pack(events, true)
    }

    fn stored(
        &self,
        parent: Option<SequenceHash>,
        parent_block_id: Option<EngineBlockId>,
        blocks: Vec<StoredBlock>,
    ) -> KvEvent {
        KvEvent::Stored {
            parent,
            parent_block_id,
            blocks,
            block_size: self.block_size,
        }
    }

    /// Packs events into batches of at most `max_blocks` blocks, splitting large events.
    fn pack(&mut self, events: Vec<KvEvent>, resync: bool) -> Vec<KvEventBatch> {
        let mut batches = Vec::new();
        let mut current: Vec<KvEvent> = Vec::new();
        let mut room = self.max_blocks;
        for event in events {
            for piece in split_event(event, self.max_blocks) {
                let size = event_blocks(&piece);
                if size > room && !current.is_empty() {
                    batches.push(std::mem::take(&mut current));
                    room = self.max_blocks;
                }
                room = room.saturating_sub(size);
                current.push(piece);
            }
        }
        if !current.is_empty() {
            batches.push(current);
        }
        batches
            .into_iter()
            .map(|events| {
                let seq = self.next_seq;
                self.next_seq += 1;
                KvEventBatch {
                    v: PROTOCOL_VERSION,
                    worker_id: self.worker_id.clone(),
                    instance_id: self.instance_id,
                    seq,
                    resync,
                    events,
                }
            })
            .collect()
    }
}

/// Blocks an event names.
fn event_blocks(event: &KvEvent) -> usize {
    match event {
        KvEvent::Stored { blocks, .. } => blocks.len(),
        KvEvent::Removed { block_ids } => block_ids.len(),
        KvEvent::Cleared => 0,
    }
}

/// Splits an event naming more than `max` blocks into pieces of at most `max`.
fn split_event(event: KvEvent, max: usize) -> Vec<KvEvent> {
    match event {
        KvEvent::Stored {
            parent,
            parent_block_id,
            blocks,
            block_size,
        } if blocks.len() > max => {
            let (mut parent, mut parent_block_id) = (parent, parent_block_id);
            blocks
                .chunks(max)
                .map(|chunk| {
                    let piece = KvEvent::Stored {
                        parent,
                        parent_block_id,
                        blocks: chunk.to_vec(),
                        block_size,
                    };
                    parent = chunk.last().map(|b| b.seq_hash);
                    parent_block_id = chunk.last().map(|b| b.block_id);
                    piece
                })
                .collect()
        }
        KvEvent::Removed { block_ids } if block_ids.len() > max => block_ids
            .chunks(max)
            .map(|chunk| KvEvent::Removed {
                block_ids: chunk.to_vec(),
            })
            .collect(),
        other => vec![other],
    }
}
