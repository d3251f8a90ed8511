//! vLLM events → Switchyard [`KvEvent`]s, one [`HashMapper`] per vLLM publisher.
//!
//! vLLM names blocks by its own hashes (SHA-256 over the parent's hash, the tokens and extra
//! keys, with a per-deployment seed), which the router cannot compute from a prompt.
//! Switchyard's index is keyed by [`SequenceHash`]es computed from token ids
//! ([`switchyard_protocol::hash`]). The mapper computes ours from each `BlockStored`'s token
//! ids, chained from the parent's Switchyard hash, and remembers vLLM hash → ours so that:
//! - a later event's `parent_block_hash` resolves to the parent's [`SequenceHash`];
//! - removals keep naming blocks by vLLM's hash, as [`EngineBlockId`]s (the index maps those
//!   back itself).
//!
//! The map holds one entry per block the engine holds (a removal drops it, a clear drops
//! all), so memory follows the engine's cache size.
//!
//! # Copies
//! vLLM may cache one hash in several physical blocks: a fully cached prompt still recomputes
//! its last block, and two requests with the same prefix in one step compute it twice. Each
//! copy is announced by its own `BlockStored` and evicted by its own `BlockRemoved`. So a
//! repeated store is accepted (same hashes; the index takes the repeated `Stored` as a
//! no-op), the mapper counts copies, and a removal reaches the index only with the last copy
//! ([`Ignored::StillCached`] before that) — otherwise evicting the spare copy of a
//! conversation's last block would hide the cached one, and the next turn, whose parent it
//! is, would look like a missed event.
//!
//! # What the caller must do
//! - Keep **one mapper per (worker, data-parallel rank)**: every rank is its own engine with
//!   its own cache and publisher. [`MappedBatch::data_parallel_rank`] carries the rank through.
//! - Apply batches in sequence order, with nothing missed. A `BlockStored` whose parent the
//!   mapper does not know means events were missed: [`Outcome::ResyncNeeded`]. The mapper does
//!   not guess a hash for it; replay the missed batches (see [`super::replay`]) or, if they are
//!   gone, [`HashMapper::reset`] and publish the `Cleared` it returns.
//!
//! # What is not indexed
//! - Events of another KV cache group ([`MapperConfig::group_idx`]) or medium
//!   ([`MapperConfig::medium`]): a hybrid model announces a block once per group, and an
//!   offloading connector announces CPU copies under the same hashes; mixing them would let a
//!   CPU eviction remove a GPU block.
//! - Blocks whose vLLM hash covers more than their token ids (a LoRA adapter, multimodal
//!   inputs, a cache salt: see [`VllmEvent::BlockStored::hashed_with_extra_keys`]), and their
//!   descendants. Equal tokens do not mean equal KV there, and
//!   [`HashSeed`](switchyard_protocol::hash::HashSeed)s for adapters and
//!   salts are not defined yet. They are remembered, so their children are recognised rather
//!   than taken for missed events.

mod outcome;

use std::collections::HashMap;

use switchyard_protocol::hash::{local_block_hashes, sequence_hashes_from, SequenceHash};
use switchyard_protocol::kv::{EngineBlockId, KvEvent, StoredBlock};

pub use outcome::{Ignored, MapError, MappedBatch, MapperConfig, Outcome};

use super::batch::{VllmBatch, VllmEvent};

/// What the mapper knows of one vLLM block hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    /// Switchyard's hash; `None` for a block held but not indexed (see the module docs).
    seq_hash: Option<SequenceHash>,
    /// Physical copies the engine caches (see the module docs); at least 1.
    copies: u32,
}

/// Maps one vLLM publisher's events to Switchyard events (see the module docs).
#[derive(Debug, Clone)]
pub struct HashMapper {
    config: MapperConfig,
    blocks: HashMap<u64, Entry>,
}

impl HashMapper {
    /// A mapper that knows no blocks yet.
    pub fn new(config: MapperConfig) -> Self {
        HashMapper {
            config,
            blocks: HashMap::new(),
        }
    }

    /// Its configuration.
    pub fn config(&self) -> &MapperConfig {
        &self.config
    }

    /// Distinct blocks it knows (indexed or not).
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether it knows no blocks.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Switchyard's hash of the block vLLM calls `vllm_hash`, if indexed.
    pub fn seq_hash(&self, vllm_hash: u64) -> Option<SequenceHash> {
        self.blocks.get(&vllm_hash).and_then(|e| e.seq_hash)
    }

    /// How many copies of `vllm_hash` the engine caches, as far as the mapper knows (indexed
    /// or not); 0 if none.
    pub fn copies(&self, vllm_hash: u64) -> u32 {
        self.blocks.get(&vllm_hash).map_or(0, |e| e.copies)
    }

    /// Forgets every block, for a fresh start after missed events that cannot be replayed;
    /// publish the returned event so the index forgets them too.
    pub fn reset(&mut self) -> KvEvent {
        self.blocks.clear();
        KvEvent::Cleared
    }

    /// Applies every event of `batch`, in order.
    pub fn apply_batch(&mut self, batch: &VllmBatch) -> MappedBatch {
        MappedBatch {
            seq: batch.seq,
            data_parallel_rank: batch.data_parallel_rank,
            outcomes: batch.events.iter().map(|e| self.apply(e)).collect(),
        }
    }

    /// Applies one event.
    ///
    /// # Errors
    /// [`MapError`] for a `BlockStored` whose block size or token count is wrong; nothing is
    /// applied then.
    pub fn apply(&mut self, event: &VllmEvent) -> Result<Outcome, MapError> {
        match event {
            VllmEvent::BlockStored {
                block_hashes,
                parent,
                token_ids,
                block_size,
                lora_id,
                medium,
                group_idx,
                hashed_with_extra_keys,
            } => {
                if let Some(ignored) = self.filter(*group_idx, medium.as_deref()) {
                    return Ok(Outcome::Ignored(ignored));
                }
                self.check_shape(block_hashes.len(), *block_size, token_ids.len())?;
                if block_hashes.is_empty() {
                    return Ok(Outcome::Ignored(Ignored::Empty));
                }
                if lora_id.is_some() || *hashed_with_extra_keys {
                    // Not indexed, wherever the chain starts.
                    return Ok(self.store_not_indexed(block_hashes));
                }
                Ok(self.store(block_hashes, *parent, token_ids, medium))
            }
            VllmEvent::BlockRemoved {
                block_hashes,
                medium,
                group_idx,
            } => {
                if let Some(ignored) = self.filter(*group_idx, medium.as_deref()) {
                    return Ok(Outcome::Ignored(ignored));
                }
                Ok(self.remove(block_hashes, medium))
            }
            VllmEvent::AllBlocksCleared => Ok(Outcome::Forward {
                event: self.reset(),
                medium: None,
            }),
        }
    }

    fn filter(&self, group_idx: Option<i64>, medium: Option<&str>) -> Option<Ignored> {
        let group_idx = group_idx.unwrap_or(0);
        if group_idx != self.config.group_idx {
            return Some(Ignored::OtherGroup { group_idx });
        }
        match (self.config.medium.as_deref(), medium) {
            (Some(wanted), Some(got)) if wanted != got => Some(Ignored::OtherMedium {
                medium: got.to_owned(),
            }),
            _ => None,
        }
    }

    fn check_shape(&self, blocks: usize, block_size: u32, tokens: usize) -> Result<(), MapError> {
        let expected = self.config.block_size.get();
        if block_size != expected {
            return Err(MapError::BlockSizeMismatch {
                expected,
                got: block_size,
            });
        }
        let full = usize::try_from(block_size)
            .ok()
            .and_then(|bs| blocks.checked_mul(bs));
        if full != Some(tokens) {
            return Err(MapError::TokenCountMismatch {
                blocks,
                block_size,
                tokens,
            });
        }
        Ok(())
    }

    /// Counts one more copy of `vllm`, now known under `seq_hash`.
    fn add_copy(&mut self, vllm: u64, seq_hash: Option<SequenceHash>) {
        let entry = self.blocks.entry(vllm).or_insert(Entry {
            seq_hash,
            copies: 0,
        });
        entry.seq_hash = seq_hash;
        entry.copies = entry.copies.saturating_add(1);
    }

    /// Stores a token-keyed chain whose shape has been checked.
    fn store(
        &mut self,
        block_hashes: &[u64],
        parent: Option<u64>,
        token_ids: &[u32],
        medium: &Option<String>,
    ) -> Outcome {
        let parent_seq = match parent {
            None => None,
            Some(p) => match self.blocks.get(&p).map(|e| e.seq_hash) {
                Some(Some(h)) => Some(h),
                // The child of a block that is not indexed is not indexed either.
                Some(None) => return self.store_not_indexed(block_hashes),
                None => {
                    return Outcome::ResyncNeeded {
                        missing_parent: EngineBlockId(p),
                    }
                }
            },
        };
        let seed = self.config.seed;
        let locals = local_block_hashes(token_ids, self.config.block_size, seed);
        let seqs = sequence_hashes_from(parent_seq, &locals, seed);
        let mut blocks = Vec::with_capacity(block_hashes.len());
        for (&vllm, seq_hash) in block_hashes.iter().zip(seqs) {
            self.add_copy(vllm, Some(seq_hash));
            blocks.push(StoredBlock {
                seq_hash,
                block_id: EngineBlockId(vllm),
            });
        }
        Outcome::Forward {
            event: KvEvent::Stored {
                parent: parent_seq,
                // vLLM names blocks by their hash, the parent too: it is the parent's engine id.
                parent_block_id: parent_seq.and(parent).map(EngineBlockId),
                blocks,
                block_size: self.config.block_size.get(),
            },
            medium: medium.clone(),
        }
    }

    fn store_not_indexed(&mut self, block_hashes: &[u64]) -> Outcome {
        for &vllm in block_hashes {
            self.add_copy(vllm, None);
        }
        Outcome::Ignored(Ignored::NotTokenKeyed)
    }

    fn remove(&mut self, block_hashes: &[u64], medium: &Option<String>) -> Outcome {
        let mut block_ids = Vec::new();
        let mut still_cached = false;
        for &vllm in block_hashes {
            let Some(entry) = self.blocks.get_mut(&vllm) else {
                continue;
            };
            entry.copies = entry.copies.saturating_sub(1);
            if entry.copies > 0 {
                still_cached = true;
                continue;
            }
            if entry.seq_hash.is_some() {
                block_ids.push(EngineBlockId(vllm));
            }
            self.blocks.remove(&vllm);
        }
        match (block_ids.is_empty(), still_cached) {
            (false, _) => Outcome::Forward {
                event: KvEvent::Removed { block_ids },
                medium: medium.clone(),
            },
            (true, true) => Outcome::Ignored(Ignored::StillCached),
            (true, false) => Outcome::Ignored(Ignored::NotIndexed),
        }
    }
}
