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
//!   their random accesses do not each pay a TLB miss;
//! - a small table of prompts' first blocks (`roots`), so that a miss does not touch the big
//!   table, and a list of dead records whose hash-table entries are removed in batches
//!   (`pending`, see `drop_holder`).
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

/// Blocks whose cache misses are started together (see `U64Table::prefetch`). A stored block
/// loads two lines (its home line and the next) in each of two tables (its worker's engine
/// ids, the hashes), so 8 blocks put 32 line loads in flight. 16 blocks overflowed the core's
/// miss buffers on an AMD EPYC VM with a 32 MiB L3, where the 60 MB hash table lives in DRAM:
/// ingest at 4 M pairs ran at 16 M blocks/s against 26 M with 8; 4 gave 25 M and 12 gave 18 M
/// (`docs/kv-index-vs-dynamo.md`, 2026-12-04).
const PREFETCH: usize = 8;

/// Dead records whose hash-table entries are removed together (see `KvIndex::flush_dead`):
/// enough that their misses overlap, few enough that the table barely fills with them.
const FLUSH_DEAD: usize = if cfg!(test) { 16 } else { 4096 };

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
    /// `(hash, record)` of records that died since the last flush: their hash-table entries
    /// still point at them (see [`drop_holder`]) until [`KvIndex::flush_dead`] removes them.
    pending: Vec<(u64, u32)>,
    /// Hashes stored as a prompt's first block (a `Stored` event without parent, see
    /// [`KvIndex::store_after`]) -> their record. A few thousand at most (system prompts,
    /// conversation starts), so it stays in cache, and a query whose first block is not in
    /// it is a miss without touching the big hash table (where an absent key costs a cold
    /// line). Dead entries go at compaction.
    roots: U64Table,
    /// Set by a [`KvIndex::store`] (which does not say which blocks start a prompt): from
    /// then on `roots` is incomplete and queries skip it.
    roots_unknown: bool,
    /// Kept between [`KvIndex::clear_worker`] calls: a bitmap over the records (all zero
    /// between calls) and the worker's record indices.
    scratch_bits: Vec<u64>,
    scratch_records: Vec<u32>,
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
            .reserve(blocks.saturating_sub(self.records.all.len() - self.records.dead));
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
    ///
    /// The worker's records are visited in record order, not in its engine-id table's (hash)
    /// order: a bitmap over the records marks the worker's (and drops duplicates, a block
    /// held under several engine ids), and a scan of it yields them ascending, so that the
    /// records of a stored chain are read one after the other instead of one cache miss
    /// each. The hash-table entries of the records that die are removed in prefetched
    /// batches (`flush_dead`). Removing a worker of ~31 k blocks from 4 M pairs went from
    /// ~5 to ~1.5 ms, most of it those removals (`docs/kv-index-vs-dynamo.md`).
    pub fn clear_worker(&mut self, slot: WorkerSlot) {
        let Some(Some(worker)) = self.workers.get_mut(usize::from(slot.0)) else {
            return;
        };
        let engine = std::mem::take(&mut worker.engine);
        worker.extra_copies.clear();
        if engine.is_empty() {
            return;
        }
        // The bitmap is kept between calls (1 bit per record): a fresh one would be a new
        // mapping, its pages faulted in one by one. The scan leaves it zeroed.
        let mut marked = std::mem::take(&mut self.scratch_bits);
        marked.resize(self.records.all.len().div_ceil(64), 0);
        for (_, record) in engine.iter() {
            marked[record as usize / 64] |= 1 << (record % 64);
        }
        drop(engine);
        let mut mine = std::mem::take(&mut self.scratch_records);
        mine.clear();
        for (word, bits) in marked.iter_mut().enumerate() {
            let mut bits = std::mem::take(bits);
            while bits != 0 {
                mine.push((word * 64) as u32 + bits.trailing_zeros());
                bits &= bits - 1;
            }
        }
        let mut d = Dropped::default();
        let all: &mut [Record] = &mut self.records.all;
        for &record in &mine {
            drop_holder_in(
                all,
                &mut self.sets,
                record,
                slot.0,
                &mut d,
                &mut self.pending,
            );
        }
        d.apply(&mut self.records, &mut self.pairs);
        self.scratch_bits = marked;
        self.scratch_records = mine;
        self.maybe_compact();
    }

    /// Whether `slot` is tracked.
    pub fn has_worker(&self, slot: WorkerSlot) -> bool {
        matches!(self.workers.get(usize::from(slot.0)), Some(Some(_)))
    }

    /// Records `blocks`, a chain continuing after `parent` (`None`: `blocks[0]` is a
    /// prompt's first block), as cached on `slot`: a `Stored` event. The parent's only use is
    /// to know the prompts' first blocks, which make misses cheap (see `roots`); a sequence
    /// hash already names its whole prefix. Untracked slots are ignored.
    pub fn store_after(
        &mut self,
        slot: WorkerSlot,
        parent: Option<SequenceHash>,
        blocks: &[StoredBlock],
    ) -> ApplyCounts {
        let counts = self.store_blocks(slot, blocks);
        if let (None, Some(first)) = (parent, blocks.first()) {
            if let Some(record) = self.lookup(first.seq_hash.0) {
                self.roots.insert(first.seq_hash.0, record);
            }
        }
        counts
    }

    /// Records `blocks` as cached on `slot` without saying whether `blocks[0]` starts a
    /// prompt. Correct, but it turns the index's check of a query's first block off for good
    /// (see `roots`): a caller that knows the parent uses [`KvIndex::store_after`].
    pub fn store(&mut self, slot: WorkerSlot, blocks: &[StoredBlock]) -> ApplyCounts {
        self.roots_unknown = true;
        self.store_blocks(slot, blocks)
    }

    /// A block whose parent the index lacks is simply never reached by a query (matching
    /// stops at the first miss).
    fn store_blocks(&mut self, slot: WorkerSlot, blocks: &[StoredBlock]) -> ApplyCounts {
        let mut counts = ApplyCounts::default();
        if !self.has_worker(slot) {
            return counts;
        }
        if !self.pending.is_empty() && self.holders.spare() < blocks.len() {
            // Dead entries fill the table: remove them rather than grow it.
            self.flush_dead();
        }
        let Some(Some(worker)) = self.workers.get_mut(usize::from(slot.0)) else {
            return counts;
        };
        let WorkerBlocks {
            engine,
            extra_copies,
        } = worker;
        let mut p = Parts {
            records: &mut self.records,
            sets: &mut self.sets,
            pairs: &mut self.pairs,
            pending: &mut self.pending,
        };
        // Start every cache miss of a chunk at once (see `U64Table::prefetch`), one chunk
        // ahead of the one being applied, so that misses are always in flight.
        let first = &blocks[..blocks.len().min(PREFETCH)];
        engine.prefetch(first.iter().map(|b| b.block_id.0));
        self.holders.prefetch(first.iter().map(|b| b.seq_hash.0));
        for (c, chunk) in blocks.chunks(PREFETCH).enumerate() {
            let next = blocks.get((c + 1) * PREFETCH..).unwrap_or_default();
            let next = &next[..next.len().min(PREFETCH)];
            engine.prefetch(next.iter().map(|b| b.block_id.0));
            // The hash table is viewed once per chunk (see `U64Table::batch`); the view ends
            // where dropping a replaced block may remove keys from it.
            let mut holders = self.holders.batch(chunk.len());
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
                    if !release_copy(extra_copies, old) {
                        drop_holder(p.reborrow(), old, slot.0);
                    }
                    counts.removed += 1;
                }
                let (record_slot, new_hash) = holders.entry(hash);
                // A hash whose record died is new again (its entry is reused).
                let reused = !new_hash && !p.records.all[*record_slot as usize].is_live();
                let (record, already) = if new_hash || reused {
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
        let mut d = Dropped::default();
        let all: &mut [Record] = &mut self.records.all;
        let mut found = [0u32; PREFETCH];
        // As in `store_blocks`: each chunk's engine-id lines load while the chunk before it
        // is applied, and the records a chunk names load together before they are dropped.
        let first = &block_ids[..block_ids.len().min(PREFETCH)];
        worker.engine.prefetch(first.iter().map(|id| id.0));
        for (c, chunk) in block_ids.chunks(PREFETCH).enumerate() {
            let next = block_ids.get((c + 1) * PREFETCH..).unwrap_or_default();
            worker
                .engine
                .prefetch(next[..next.len().min(PREFETCH)].iter().map(|id| id.0));
            let mut n = 0;
            for id in chunk {
                match worker.engine.remove(id.0) {
                    Some(record) => {
                        if let Some(r) = all.get(record as usize) {
                            prefetch::prefetch(r);
                        }
                        found[n] = record;
                        n += 1;
                    }
                    None => counts.unknown_removals += 1,
                }
            }
            for &record in &found[..n] {
                if !release_copy(&mut worker.extra_copies, record) {
                    drop_holder_in(
                        all,
                        &mut self.sets,
                        record,
                        slot.0,
                        &mut d,
                        &mut self.pending,
                    );
                    counts.removed += 1;
                }
            }
        }
        d.apply(&mut self.records, &mut self.pairs);
        self.maybe_compact();
        counts
    }

    /// Compacts the records when enough died, rewriting every index into them, and removes
    /// the dead records' hash-table entries once enough are pending.
    fn maybe_compact(&mut self) {
        if self.records.should_compact() {
            self.compact();
        } else if self.pending.len() >= FLUSH_DEAD {
            self.flush_dead();
        }
    }

    /// Removes the pending dead records' entries from the hash table in one batch, each line
    /// loading (prefetch) ahead of its removal, so the misses overlap
    /// ([`U64Table::remove_all_if`]). An entry that a later `Stored` event reused for a new
    /// record (it points elsewhere now) stays.
    fn flush_dead(&mut self) {
        self.holders.remove_all_if(&self.pending);
        self.pending.clear();
    }

    /// Drops the dead records and the hash-table entries pointing at them, rewriting every
    /// index into the records.
    fn compact(&mut self) {
        // Pending entries name records by their old index: out before the remap.
        self.flush_dead();
        let remap = self.records.compact();
        self.holders.retain(|v| {
            let live = remap.is_live(*v);
            if live {
                *v = remap.get(*v);
            }
            live
        });
        self.roots.retain(|v| {
            let live = remap.is_live(*v);
            if live {
                *v = remap.get(*v);
            }
            live
        });
        let fix = |v: &mut u32| *v = remap.get(*v);
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
        self.lookup(hash.0)
            .map_or(0, |i| self.sets.count(self.records.all[i as usize].set))
    }

    /// The live record of `hash`, if any (the table may point at a dead one, see
    /// [`drop_holder`]).
    fn lookup(&self, hash: u64) -> Option<u32> {
        let i = self.holders.get(hash)?;
        self.records.all[i as usize].is_live().then_some(i)
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
            + self.roots.heap_bytes()
            + self.records.heap_bytes()
            + self.sets.heap_bytes()
            + self.workers.capacity() * std::mem::size_of::<Option<WorkerBlocks>>()
            + per_worker;
        IndexStats {
            pairs: self.pairs,
            distinct_hashes: (self.records.all.len() - self.records.dead) as u64,
            approx_bytes: bytes as u64,
        }
    }
}

/// The shared structures a worker's update touches, borrowed apart from the worker table
/// and the hash table.
struct Parts<'a> {
    records: &'a mut Records,
    sets: &'a mut SetArena,
    pairs: &'a mut u64,
    pending: &'a mut Vec<(u64, u32)>,
}

impl Parts<'_> {
    fn reborrow(&mut self) -> Parts<'_> {
        Parts {
            records: self.records,
            sets: self.sets,
            pairs: self.pairs,
            pending: self.pending,
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
///
/// Its hash stays in the hash table, pointing at the dead record, and goes on the pending
/// list; [`KvIndex::flush_dead`] removes a few thousand at once, their cache misses
/// overlapped. Meanwhile every lookup checks that the record it reaches is live. Removing
/// it here was a probe of a random line of a table of tens of MB per dying block, its miss
/// on the removal's path: most of the cost of removals and of removing a worker.
fn drop_holder(p: Parts<'_>, record: u32, slot: u16) {
    let mut d = Dropped::default();
    drop_holder_in(&mut p.records.all, p.sets, record, slot, &mut d, p.pending);
    d.apply(p.records, p.pairs);
}

/// What [`drop_holder_in`] calls did, to apply to the counts once.
#[derive(Default)]
struct Dropped {
    pairs: u64,
    dead: usize,
}

impl Dropped {
    fn apply(self, records: &mut Records, pairs: &mut u64) {
        *pairs -= self.pairs;
        records.dead += self.dead;
    }
}

/// [`drop_holder`] on a view of the records taken once by the caller (each view of a
/// mapping checks its layout), counting into `d`.
#[inline(always)]
fn drop_holder_in(
    all: &mut [Record],
    sets: &mut SetArena,
    record: u32,
    slot: u16,
    d: &mut Dropped,
    pending: &mut Vec<(u64, u32)>,
) {
    let r = &mut all[record as usize];
    if !r.is_live() {
        return;
    }
    let (new, had) = sets.remove(r.set, slot);
    match new {
        Some(set) => r.set = set,
        None => {
            pending.push((r.hash(), record));
            *r = Record::new(0, records::DEAD);
            d.dead += 1;
        }
    }
    d.pairs += u64::from(had);
}
