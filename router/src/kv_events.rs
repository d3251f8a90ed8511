//! Applying KV event batches: ordering by per-worker sequence numbers, resync, validation.
//!
//! Rules (the worker side is described in `switchyard_protocol::kv`):
//! - unknown worker → [`KvEventError::UnknownWorker`]; a `stored` event whose block size
//!   differs from the registration → [`KvEventError::BlockSizeMismatch`]; a sequence number
//!   at or below the last applied one → [`KvEventError::Stale`]. Nothing is applied then.
//! - a batch from another process instance than the registered one →
//!   [`KvEventError::OtherInstance`], nothing applied and no resync: a restarted worker's
//!   heartbeat, when it comes, re-registers it and asks for its dump; a second process under
//!   a taken id (refused `id_in_use`) must not clear the registered one's blocks, nor, through
//!   the id's resync subject, make it dump its cache for every batch.
//! - a resync batch starting with `cleared` rebuilds the worker's state whatever its
//!   sequence number → `Applied`.
//! - otherwise the batch is applied; if its number is not the next one (or it is the first
//!   batch seen and not number 1) → `NeedsResync`: stored blocks are facts worth keeping, but
//!   removals in the gap were missed. Later batches continue from this number, so one gap
//!   asks for one resync.
//! - if the worker's blocks then pass [`held_blocks_limit`] of its capacity, they are all
//!   dropped → `OverCapacity` (a resync rebuilds them).

use switchyard_protocol::kv::{KvEvent, KvEventBatch};

use super::{held_blocks_limit, KvApplyOutcome, KvEventError, Router};

impl Router {
    /// Applies one batch of KV events from a worker (see the module docs for the rules).
    ///
    /// # Errors
    /// See [`KvEventError`]; nothing is applied on error.
    pub fn apply_kv_batch(&mut self, batch: &KvEventBatch) -> Result<KvApplyOutcome, KvEventError> {
        let Some(worker) = self.workers.get_mut(&batch.worker_id) else {
            return Err(KvEventError::UnknownWorker(batch.worker_id.clone()));
        };
        if batch.instance_id != worker.info.instance_id {
            return Err(KvEventError::OtherInstance {
                worker: batch.worker_id.clone(),
                got: batch.instance_id,
                registered: worker.info.instance_id,
            });
        }
        for event in &batch.events {
            if let KvEvent::Stored { block_size, .. } = event {
                if *block_size != worker.info.block_size {
                    return Err(KvEventError::BlockSizeMismatch {
                        worker: batch.worker_id.clone(),
                        got: *block_size,
                        registered: worker.info.block_size,
                    });
                }
            }
        }
        let rebuild = batch.resync && matches!(batch.events.first(), Some(KvEvent::Cleared));
        let in_order = match worker.last_kv_seq {
            // A rebuild carries the worker's whole state: it is what a gap, or a number
            // that ran ahead (a bad or forged batch), asked for, so no number refuses it.
            Some(_) if rebuild => true,
            Some(applied) if batch.seq <= applied => {
                return Err(KvEventError::Stale {
                    worker: batch.worker_id.clone(),
                    seq: batch.seq,
                    applied,
                });
            }
            Some(applied) => batch.seq == applied + 1,
            None => batch.seq == 1,
        };
        worker.last_kv_seq = Some(batch.seq);
        let slot = worker.slot;
        let limit = held_blocks_limit(worker.info.kv_capacity_blocks);
        for event in &batch.events {
            match event {
                KvEvent::Stored {
                    parent,
                    parent_block_id,
                    blocks,
                    ..
                } => {
                    let c = self
                        .index
                        .store_after(slot, *parent, *parent_block_id, blocks);
                    self.kv_counters.blocks_stored += c.stored;
                    self.kv_counters.blocks_removed += c.removed;
                    self.predictions
                        .confirm(slot, |tail| blocks.iter().any(|b| b.seq_hash == *tail));
                }
                KvEvent::Removed { block_ids } => {
                    let c = self.index.remove(slot, block_ids);
                    self.kv_counters.blocks_removed += c.removed;
                    self.kv_counters.unknown_removals += c.unknown_removals;
                }
                KvEvent::Cleared => {
                    self.count_blocks_dropped(slot);
                    self.index.clear_worker(slot);
                    self.kv_counters.clears += 1;
                }
            }
        }
        let held = self.index.blocks_of(slot) as u64;
        if held > limit {
            self.count_blocks_dropped(slot);
            self.index.clear_worker(slot);
            self.kv_counters.over_capacity_drops += 1;
            return Ok(KvApplyOutcome::OverCapacity { held, limit });
        }
        Ok(if in_order || rebuild {
            KvApplyOutcome::Applied
        } else {
            KvApplyOutcome::NeedsResync
        })
    }
}
