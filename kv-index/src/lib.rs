//! Which workers cache which block sequences, and how much of a prompt each one holds.
//!
//! Keyed by [`SequenceHash`]: since a sequence hash names a block *and its whole prefix*, a
//! flat map `hash -> set of workers` answers "does worker w hold the first i blocks of this
//! prompt" without a tree. A prefix cache only reuses block `i` if blocks `0..i` are cached
//! too, so a query walks the prompt's hashes in order, intersecting the candidate set with
//! each block's holders, and a worker's match ends at its first miss. It stops as soon as no
//! candidate is left, so a cold prompt costs one lookup.
//!
//! Layout (see `docs/kv-index.md` for measurements):
//! - `records::Records`: one 12-byte record per distinct hash, `(hash, holders)`, in the
//!   order blocks were first stored, so a stored chain is contiguous and a query follows it
//!   sequentially; holders are up to two worker slots inline, larger sets bitsets in a
//!   `worker_set::SetArena`;
//! - one `table::U64Table` `sequence hash -> record index` (64-byte lines of 5 slots), consulted
//!   where a prompt leaves a stored chain;
//! - per worker slot, a table `engine block id -> record index` (same table type), because
//!   removal events name blocks by the engine's own id; plus a rarely used count of records
//!   the worker stored under more than one engine id, so removing one copy keeps the other.
//! - the hash table and the records, once 2 MiB or more, on 2 MiB pages (`pages`), so that
//!   their random accesses do not each pay a TLB miss.
//!
//! Workers are addressed by a dense [`WorkerSlot`] the owner (the router) allocates, so sets
//! hold 15-bit integers instead of names.
//!
//! A crate of its own, with no I/O and no async runtime, so that it can be measured alone
//! (`benches/kv_index.rs`, and against Dynamo's indexer in `benches/index-vs-dynamo/` at the
//! repository root); the router re-exports it as `switchyard_router::index`.

#![deny(missing_docs)]

mod pages;
mod prefetch;
mod query;
mod records;
pub mod table;
mod worker_set;

#[cfg(test)]
mod tests;

use std::collections::HashMap;

use switchyard_protocol::hash::SequenceHash;
use switchyard_protocol::kv::{EngineBlockId, StoredBlock};

use records::{Record, Records};
use table::U64Table;
use worker_set::{PackedSet, SetArena};

pub use worker_set::MAX_SLOT;

/// Blocks whose cache misses are started together (see `U64Table::prefetch`): enough to
/// keep a core's outstanding-miss buffers busy.
const PREFETCH: usize = 16;

/// Dense index of a worker in the KV index (`0..=MAX_SLOT`), allocated by the owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerSlot(pub u16);

/// Result of a prefix query: for every worker holding at least the prompt's first block, how
/// many leading blocks it holds. Reuse one value across queries to avoid allocating.
#[derive(Debug, Default, Clone)]
pub struct OverlapScores {
    /// `(worker, matched leading blocks)`, ascending by worker slot within each match length.
    pub matches: Vec<(WorkerSlot, u32)>,
    candidates: Vec<u64>,
}

impl OverlapScores {
    /// Matched leading blocks of `slot` (0 when absent).
    pub fn blocks_for(&self, slot: WorkerSlot) -> u32 {
        self.matches
            .iter()
            .find(|(s, _)| *s == slot)
            .map_or(0, |(_, n)| *n)
    }
}

/// Size of the index, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct IndexStats {
    /// Stored (worker, block) pairs.
    pub pairs: u64,
    /// Distinct sequence hashes.
    pub distinct_hashes: u64,
    /// Bytes held by the index's tables and sets (heap allocations, excluding allocator
    /// overhead).
    pub approx_bytes: u64,
}

/// What applying a `Stored` or `Removed` event did, for counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ApplyCounts {
    /// Blocks newly recorded on the worker.
    pub stored: u64,
    /// Blocks dropped from the worker.
    pub removed: u64,
    /// Removals naming an engine block id the index never saw (harmless: events before a
    /// resync, or a block stored before the router started).
    pub unknown_removals: u64,
}

#[derive(Debug, Default)]
struct WorkerBlocks {
    /// Engine block id -> record index.
    engine: U64Table,
    /// Record index -> extra copies, for blocks this worker stored under several engine ids.
    extra_copies: HashMap<u32, u32>,
}

/// The KV index. See the module docs.
#[derive(Debug, Default)]
pub struct KvIndex {
    holders: U64Table,
    records: Records,
    sets: SetArena,
    workers: Vec<Option<WorkerBlocks>>,
    pairs: u64,
}

impl KvIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts tracking `slot` (empty). Re-adding a tracked slot clears it. Slots above
    /// [`MAX_SLOT`] are clamped to it (the router never allocates them).
    pub fn add_worker(&mut self, slot: WorkerSlot) {
        self.add_worker_with_capacity(slot, 0);
    }

    /// Like [`KvIndex::add_worker`], with the worker's engine-id table sized for
    /// `kv_capacity_blocks` blocks (its KV capacity), so it never rehashes while it fills.
    pub fn add_worker_with_capacity(&mut self, slot: WorkerSlot, kv_capacity_blocks: usize) {
        let slot = WorkerSlot(slot.0.min(MAX_SLOT));
        self.clear_worker(slot);
        let i = usize::from(slot.0);
        if self.workers.len() <= i {
            self.workers.resize_with(i + 1, || None);
        }
        self.workers[i] = Some(WorkerBlocks {
            engine: U64Table::with_capacity(kv_capacity_blocks),
            extra_copies: HashMap::new(),
        });
        self.sets.ensure_slot(slot.0);
    }

    /// Makes room for `blocks` distinct blocks in total without rehashing the hash table.
    /// The router reserves the cluster's total KV capacity as workers register, so the table
    /// never rehashes on the event path (a rehash of millions of blocks stalls routing, and
    /// growing from empty costs about half of the ingest time; see `docs/kv-index.md`).
    /// The record vector is reserved too, so it is not copied while it grows (at 4 M pairs
    /// the copies cost ~10 % of ingest). Both have their pages faulted in here (2 MiB pages
    /// once they are big, see `pages`) rather than by page faults on the event path.
    pub fn reserve_total(&mut self, blocks: usize) {
        self.holders
            .reserve(blocks.saturating_sub(self.holders.len()));
        let missing = blocks.saturating_sub(self.records.all.len() - self.records.dead);
        self.records.all.reserve_and_fault_in(missing);
    }

    /// Forgets `slot` and every block it held.
    pub fn remove_worker(&mut self, slot: WorkerSlot) {
        self.clear_worker(slot);
        if let Some(w) = self.workers.get_mut(usize::from(slot.0)) {
            *w = None;
        }
    }

    /// Drops every block of `slot` (a `Cleared` event), keeping the worker tracked.
    pub fn clear_worker(&mut self, slot: WorkerSlot) {
        let Some(Some(worker)) = self.workers.get_mut(usize::from(slot.0)) else {
            return;
        };
        let engine = std::mem::take(&mut worker.engine);
        worker.extra_copies.clear();
        let mut seen = U64Table::with_capacity(engine.len());
        for (_, record) in engine.iter() {
            // A block held under several engine ids appears several times; drop it once.
            if seen.insert(u64::from(record), 1).is_none() {
                drop_holder(self.parts(), record, slot.0);
            }
        }
        self.maybe_compact();
    }

    /// Whether `slot` is tracked.
    pub fn has_worker(&self, slot: WorkerSlot) -> bool {
        matches!(self.workers.get(usize::from(slot.0)), Some(Some(_)))
    }

    fn parts(&mut self) -> Parts<'_> {
        Parts {
            holders: &mut self.holders,
            records: &mut self.records,
            sets: &mut self.sets,
            pairs: &mut self.pairs,
        }
    }

    /// Records `blocks` as cached on `slot`. The parent is not needed: a sequence hash already
    /// names its whole prefix, and a block whose parent the index lacks is simply never
    /// reached by a query (matching stops at the first miss). Untracked slots are ignored.
    pub fn store(&mut self, slot: WorkerSlot, blocks: &[StoredBlock]) -> ApplyCounts {
        let mut counts = ApplyCounts::default();
        let Some(Some(worker)) = self.workers.get_mut(usize::from(slot.0)) else {
            return counts;
        };
        let WorkerBlocks {
            engine,
            extra_copies,
        } = worker;
        let mut p = Parts {
            holders: &mut self.holders,
            records: &mut self.records,
            sets: &mut self.sets,
            pairs: &mut self.pairs,
        };
        // Start every cache miss of a chunk at once (see `U64Table::prefetch`), one chunk
        // ahead of the one being applied, so that misses are always in flight.
        let first = &blocks[..blocks.len().min(PREFETCH)];
        engine.prefetch(first.iter().map(|b| b.block_id.0));
        p.holders.prefetch(first.iter().map(|b| b.seq_hash.0));
        for (c, chunk) in blocks.chunks(PREFETCH).enumerate() {
            let next = blocks.get((c + 1) * PREFETCH..).unwrap_or_default();
            let next = &next[..next.len().min(PREFETCH)];
            engine.prefetch(next.iter().map(|b| b.block_id.0));
            // The hash table is viewed once per chunk (see `U64Table::batch`); the view ends
            // where dropping a replaced block may remove keys from it.
            let mut holders = p.holders.batch(chunk.len());
            holders.prefetch(next.iter().map(|b| b.seq_hash.0));
            for b in chunk {
                let hash = b.seq_hash.0;
                let (engine_slot, fresh_id) = engine.entry(b.block_id.0);
                if !fresh_id {
                    let old = *engine_slot;
                    let r = p.records.all[old as usize];
                    if r.is_live() && r.hash() == hash {
                        continue; // duplicate event: already recorded
                    }
                    // The engine reused an id for other content: the old block is gone.
                    // (The table view is not used again before it is taken anew below, so
                    // dropping the old block may change the table.)
                    if !release_copy(extra_copies, old) {
                        drop_holder(p.reborrow(), old, slot.0);
                    }
                    counts.removed += 1;
                    holders = p.holders.batch(chunk.len());
                }
                let (record_slot, new_hash) = holders.entry(hash);
                let (record, already) = if new_hash {
                    let i = p.records.push(Record::new(hash, PackedSet::one(slot.0)));
                    *record_slot = i;
                    (i, false)
                } else {
                    let i = *record_slot;
                    let r = &mut p.records.all[i as usize];
                    let (grown, had) = p.sets.insert(r.set, slot.0);
                    r.set = grown;
                    (i, had)
                };
                *engine_slot = record;
                if already {
                    *extra_copies.entry(record).or_insert(0) += 1;
                } else {
                    *p.pairs += 1;
                    counts.stored += 1;
                }
            }
        }
        self.maybe_compact();
        counts
    }

    /// Drops the blocks named by engine id from `slot`.
    pub fn remove(&mut self, slot: WorkerSlot, block_ids: &[EngineBlockId]) -> ApplyCounts {
        let mut counts = ApplyCounts::default();
        let Some(Some(worker)) = self.workers.get_mut(usize::from(slot.0)) else {
            return counts;
        };
        let mut p = Parts {
            holders: &mut self.holders,
            records: &mut self.records,
            sets: &mut self.sets,
            pairs: &mut self.pairs,
        };
        let mut found = [0u32; PREFETCH];
        for chunk in block_ids.chunks(PREFETCH) {
            worker.engine.prefetch(chunk.iter().map(|id| id.0));
            let mut n = 0;
            for id in chunk {
                match worker.engine.remove(id.0) {
                    Some(record) => {
                        found[n] = record;
                        n += 1;
                    }
                    None => counts.unknown_removals += 1,
                }
            }
            let records: &[Record] = &p.records.all;
            p.holders
                .prefetch(found[..n].iter().map(|&i| records[i as usize].hash()));
            for &record in &found[..n] {
                if !release_copy(&mut worker.extra_copies, record) {
                    drop_holder(p.reborrow(), record, slot.0);
                    counts.removed += 1;
                }
            }
        }
        self.maybe_compact();
        counts
    }

    /// Compacts the records when enough died, rewriting every index into them.
    fn maybe_compact(&mut self) {
        if !self.records.should_compact() {
            return;
        }
        let remap = self.records.compact();
        let fix = |v: &mut u32| *v = remap.get(*v);
        self.holders.for_each_value_mut(fix);
        for w in self.workers.iter_mut().flatten() {
            w.engine.for_each_value_mut(fix);
            w.extra_copies = w
                .extra_copies
                .drain()
                .map(|(k, n)| (remap.get(k), n))
                .collect();
        }
    }

    /// Number of workers holding `hash`.
    pub fn holders_of(&self, hash: SequenceHash) -> usize {
        self.holders
            .get(hash.0)
            .map_or(0, |i| self.sets.count(self.records.all[i as usize].set))
    }

    /// Distinct blocks held by `slot`.
    pub fn blocks_of(&self, slot: WorkerSlot) -> usize {
        match self.workers.get(usize::from(slot.0)) {
            Some(Some(w)) => w.engine.len() - w.extra_copies.values().sum::<u32>() as usize,
            _ => 0,
        }
    }

    /// Size, for metrics and the memory bar.
    pub fn stats(&self) -> IndexStats {
        let per_worker: usize = self
            .workers
            .iter()
            .flatten()
            .map(|w| w.engine.heap_bytes() + w.extra_copies.capacity() * 12)
            .sum();
        let bytes = self.holders.heap_bytes()
            + self.records.heap_bytes()
            + self.sets.heap_bytes()
            + self.workers.capacity() * std::mem::size_of::<Option<WorkerBlocks>>()
            + per_worker;
        IndexStats {
            pairs: self.pairs,
            distinct_hashes: self.holders.len() as u64,
            approx_bytes: bytes as u64,
        }
    }
}

/// The shared structures a worker's update touches, borrowed apart from the worker table.
struct Parts<'a> {
    holders: &'a mut U64Table,
    records: &'a mut Records,
    sets: &'a mut SetArena,
    pairs: &'a mut u64,
}

impl Parts<'_> {
    fn reborrow(&mut self) -> Parts<'_> {
        Parts {
            holders: self.holders,
            records: self.records,
            sets: self.sets,
            pairs: self.pairs,
        }
    }
}

/// Removes one extra copy of `record` if the worker has one; returns whether it did.
fn release_copy(extra: &mut HashMap<u32, u32>, record: u32) -> bool {
    if extra.is_empty() {
        return false;
    }
    match extra.get_mut(&record) {
        Some(n) if *n > 1 => {
            *n -= 1;
            true
        }
        Some(_) => {
            extra.remove(&record);
            true
        }
        None => false,
    }
}

/// Takes `slot` out of `record`'s holders; a record left without holders dies.
fn drop_holder(p: Parts<'_>, record: u32, slot: u16) {
    let r = p.records.all[record as usize];
    if !r.is_live() {
        return;
    }
    let (new, had) = p.sets.remove(r.set, slot);
    match new {
        Some(set) => p.records.all[record as usize].set = set,
        None => {
            p.holders.remove(r.hash());
            p.records.kill(record);
        }
    }
    if had {
        *p.pairs -= 1;
    }
}
