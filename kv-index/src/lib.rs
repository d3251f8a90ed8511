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
//! - one `table::U64Table` `sequence hash -> record index` (64-byte lines of 5 slots) holding
//!   only the *heads*: records the record before them does not lead to. A record that is not
//!   a head sits right after its parent block's record (a `Stored` event's blocks are
//!   appended in a row), so a query or a store reaches it by stepping from the parent, and
//!   the table is consulted only where a prompt leaves a stored chain. When a record dies,
//!   the record after it, if it was its child, becomes a head. A store finds its parent's
//!   record through the worker's engine ids (the event names the parent's engine id), so a
//!   block already stored after it is found without a table of every hash. An event whose
//!   parent cannot be found that way (an engine that does not send the parent's id, or
//!   `KvIndex::store`) turns that off: from then on every hash is in the table, until the
//!   index holds nothing again.
//!   With a table of every hash, ~60 MB at 4 M blocks, each stored and each dying block cost a
//!   random DRAM line; heads are about one per event;
//! - per worker slot, a table `engine block id -> record index` (same table type), because
//!   removal events name blocks by the engine's own id; plus a rarely used count of records
//!   the worker stored under more than one engine id, so removing one copy keeps the other.
//! - the hash table and the records, once 2 MiB or more, on 2 MiB pages (`pages`), so that
//!   their random accesses do not each pay a TLB miss;
//! - a small table of prompts' first blocks (`roots`), so that a miss does not touch the big
//!   table, and a list of dead heads whose hash-table entries are removed in batches
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
/// loads two lines (its home line and the next) of its worker's engine-id table, and of the
/// hash table while that keeps every hash. With a table of every hash (60 MB, in DRAM on an
/// AMD EPYC VM with a 32 MiB L3), 16 blocks overflowed the core's miss buffers: ingest at 4 M
/// pairs ran at 16 M blocks/s against 26 M with 8; 4 gave 25 M and 12 gave 18 M
/// (`docs/kv-index-vs-dynamo.md`, 2026-12-04). With heads only, 8 and 16 ingest alike (29–31
/// M blocks/s, quick runs of 2026-12-05) and 4 is slower (26 M).
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
    /// `(worker, matched leading blocks)`, one per worker, in no particular order.
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
    /// Entries of the hash table: the heads (see the module docs), plus dead ones not yet
    /// removed.
    pub table_hashes: u64,
    /// Whether the table keeps every hash, since a store whose parent could not be found
    /// (an engine that does not send the parent's engine id, or lost events).
    pub every_hash: bool,
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
    /// `(hash, record)` of heads that died since the last flush: their hash-table entries
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
    /// Every live record is a head (in the hash table), not only those the record before
    /// does not lead to: set by the first store whose parent's record cannot be found (see
    /// the module docs), until the index holds nothing.
    every_hash: bool,
    /// Kept between [`KvIndex::clear_worker`] calls: a bitmap over the records and one bit
    /// per word of it that has a bit set (all zero between calls).
    scratch_bits: Vec<u64>,
    scratch_words: Vec<u64>,
    scratch_word_list: Vec<u32>,
}

/// Where a `Stored` event's first block goes: what the index knows of its parent.
#[derive(Clone, Copy)]
enum After {
    /// A prompt's first block: no parent.
    Start,
    /// The parent's live record.
    Record(u32),
    /// A parent whose record cannot be found (or a store that does not say).
    Unknown,
}

/// Heads expected per stored block, for the hash table's reservation: a `Stored` event is one
/// head and usually many blocks (a prefill chunk); decode steps' one-block events are more.
const BLOCKS_PER_HEAD: usize = 8;

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

    /// Makes room for `blocks` distinct blocks in total: the records, and the hash table for
    /// the heads they are expected to have (all of them once every hash is kept). The router
    /// reserves the cluster's total KV capacity as workers register, so that the table
    /// rarely rehashes on the event path (growing a table of every hash from empty cost about
    /// half of the ingest time; see `docs/kv-index.md`).
    /// The record vector is reserved too, so it is not copied while it grows (at 4 M pairs
    /// the copies cost ~10 % of ingest). Both have their pages faulted in here (2 MiB pages
    /// once they are big, see `pages`) rather than by page faults on the event path.
    pub fn reserve_total(&mut self, blocks: usize) {
        let missing = blocks.saturating_sub(self.records.all.len() - self.records.dead);
        let heads = if self.every_hash {
            missing
        } else {
            missing / BLOCKS_PER_HEAD
        };
        self.holders.reserve(heads);
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
    /// held under several engine ids), a second bitmap marks the words of the first that have
    /// a bit set, and a scan of them yields the records without reading the whole bitmap, so
    /// that the records of a stored chain are read one after the other instead of one cache
    /// miss each. The scan runs backwards, children before parents, so that a dying parent
    /// does not make a head of a child that dies next. Only the dying heads' hash-table
    /// entries are removed, in batches (`flush_dead`).
    pub fn clear_worker(&mut self, slot: WorkerSlot) {
        let Some(Some(worker)) = self.workers.get_mut(usize::from(slot.0)) else {
            return;
        };
        let engine = std::mem::take(&mut worker.engine);
        worker.extra_copies.clear();
        if engine.is_empty() {
            return;
        }
        // The bitmaps are kept between calls: a fresh one would be a new mapping, its pages
        // faulted in one by one. The scan leaves them zeroed.
        let words = self.records.all.len().div_ceil(64);
        let mut marked = std::mem::take(&mut self.scratch_bits);
        marked.resize(words, 0);
        let mut marked_words = std::mem::take(&mut self.scratch_words);
        marked_words.resize(words.div_ceil(64), 0);
        engine.for_each_value(|record| {
            let word = record as usize / 64;
            marked[word] |= 1 << (record % 64);
            marked_words[word / 64] |= 1 << (word % 64);
        });
        drop(engine);
        let mut d = Dropped::default();
        let all: &mut [Record] = &mut self.records.all;
        // The marked words, last first; each one's records load (a prefetch) two words ahead
        // of their turn, so that a run's first lines are not waited for.
        let mut words_todo = std::mem::take(&mut self.scratch_word_list);
        words_todo.clear();
        for (high, word_bits) in marked_words.iter_mut().enumerate().rev() {
            let mut word_bits = std::mem::take(word_bits);
            while word_bits != 0 {
                let top = 63 - word_bits.leading_zeros();
                word_bits &= !(1 << top);
                words_todo.push((high * 64 + top as usize) as u32);
            }
        }
        let load_word = |all: &[Record], marked: &[u64], word: u32| {
            let bits = marked[word as usize];
            let (lo, hi) = (bits.trailing_zeros(), 63 - bits.leading_zeros());
            let base = word as usize * 64;
            for r in all[base + lo as usize..=base + hi as usize]
                .iter()
                .step_by(5)
            {
                prefetch::prefetch(r);
            }
            prefetch::prefetch(&all[base + hi as usize]);
        };
        for &w in words_todo.iter().take(2) {
            load_word(all, &marked, w);
        }
        for (i, &word) in words_todo.iter().enumerate() {
            if let Some(&ahead) = words_todo.get(i + 2) {
                load_word(all, &marked, ahead);
            }
            let word = word as usize;
            let mut bits = std::mem::take(&mut marked[word]);
            while bits != 0 {
                let bit = 63 - bits.leading_zeros();
                bits &= !(1 << bit);
                drop_holder_in(
                    all,
                    &mut self.sets,
                    &mut self.holders,
                    (word * 64) as u32 + bit,
                    slot.0,
                    &mut d,
                    &mut self.pending,
                );
            }
        }
        self.scratch_word_list = words_todo;
        d.apply(&mut self.records, &mut self.pairs);
        self.scratch_bits = marked;
        self.scratch_words = marked_words;
        self.maybe_compact();
    }

    /// Whether `slot` is tracked.
    pub fn has_worker(&self, slot: WorkerSlot) -> bool {
        matches!(self.workers.get(usize::from(slot.0)), Some(Some(_)))
    }

    /// Records `blocks`, a chain continuing after `parent` (`None`: `blocks[0]` is a
    /// prompt's first block), as cached on `slot`: a `Stored` event. `parent_block` is the
    /// parent's engine id on this worker; it finds the parent's record, so that a block
    /// already stored right after it (by another worker) is found without a table of every
    /// hash. Without it, or if the worker does not hold it, the parent is looked up among the
    /// heads; failing that, the index keeps every hash from then on, until it holds nothing
    /// (see the module docs). A prompt's first blocks also make misses cheap (see `roots`).
    /// Untracked slots are ignored.
    pub fn store_after(
        &mut self,
        slot: WorkerSlot,
        parent: Option<SequenceHash>,
        parent_block: Option<EngineBlockId>,
        blocks: &[StoredBlock],
    ) -> ApplyCounts {
        if !self.has_worker(slot) {
            return ApplyCounts::default();
        }
        let after = match parent {
            None => After::Start,
            Some(p) => self
                .parent_record(slot, p.0, parent_block)
                .map_or(After::Unknown, After::Record),
        };
        let counts = self.store_blocks(slot, after, blocks);
        if let (None, Some(first)) = (parent, blocks.first()) {
            if let Some(record) = self.lookup(first.seq_hash.0) {
                self.roots.insert(first.seq_hash.0, record);
            }
        }
        counts
    }

    /// Records `blocks` as cached on `slot` without saying what they continue. Correct, but
    /// it turns off for good the index's check of a query's first block (see `roots`), and
    /// its table of heads only until the index holds nothing: a caller that knows the parent
    /// uses [`KvIndex::store_after`].
    pub fn store(&mut self, slot: WorkerSlot, blocks: &[StoredBlock]) -> ApplyCounts {
        if !self.has_worker(slot) {
            return ApplyCounts::default();
        }
        self.roots_unknown = true;
        self.store_blocks(slot, After::Unknown, blocks)
    }

    /// The live record of `parent`: through the worker's engine id for it, else among the
    /// heads.
    fn parent_record(
        &self,
        slot: WorkerSlot,
        parent: u64,
        parent_block: Option<EngineBlockId>,
    ) -> Option<u32> {
        let is_parent = |record: u32| {
            let r = self.records.all[record as usize];
            r.is_live() && r.hash() == parent
        };
        let by_id = parent_block.and_then(|id| match self.workers.get(usize::from(slot.0)) {
            Some(Some(w)) => w.engine.get(id.0),
            _ => None,
        });
        by_id
            .filter(|&r| is_parent(r))
            .or_else(|| self.holders.get(parent).filter(|&r| is_parent(r)))
    }

    /// Puts every live record's hash in the hash table, from now until the index holds
    /// nothing: a store whose parent's record cannot be found could otherwise record a block
    /// a second time (its record, if any, is right after the parent's, which is unknown).
    fn keep_every_hash(&mut self) {
        if self.every_hash {
            return;
        }
        self.every_hash = true;
        let live = self.records.all.len() - self.records.dead;
        self.holders
            .reserve(live.saturating_sub(self.holders.len()));
        let all: &mut [Record] = &mut self.records.all;
        for (i, r) in all.iter_mut().enumerate() {
            if r.is_live() && !r.is_head() {
                r.mark_head();
                self.holders.insert(r.hash(), i as u32);
            }
        }
    }

    /// The blocks of a `Stored` event, after what `after` says.
    fn store_blocks(
        &mut self,
        slot: WorkerSlot,
        after: After,
        blocks: &[StoredBlock],
    ) -> ApplyCounts {
        let mut counts = ApplyCounts::default();
        // The record of the block before the next one (its parent), if known.
        let mut prev = match after {
            After::Start => None,
            After::Record(r) => Some(r),
            After::Unknown => {
                self.keep_every_hash();
                None
            }
        };
        if !self.pending.is_empty() && self.holders.spare() < blocks.len() {
            // Dead entries fill the table: remove them rather than grow it.
            self.flush_dead();
        }
        let every_hash = self.every_hash;
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
            pending: &mut self.pending,
        };
        // Start the engine-id table's cache misses of a chunk at once (see
        // `U64Table::prefetch`), one chunk ahead of the one being applied, so that misses are
        // always in flight. (The hash table holds heads only, and its lines are mostly
        // cached; a new block's record is the one after its parent's.)
        let first = &blocks[..blocks.len().min(PREFETCH)];
        engine.prefetch(first.iter().map(|b| b.block_id.0));
        for (c, chunk) in blocks.chunks(PREFETCH).enumerate() {
            let next = blocks.get((c + 1) * PREFETCH..).unwrap_or_default();
            let next = &next[..next.len().min(PREFETCH)];
            engine.prefetch(next.iter().map(|b| b.block_id.0));
            if every_hash {
                p.holders.prefetch(next.iter().map(|b| b.seq_hash.0));
            }
            for b in chunk {
                let hash = b.seq_hash.0;
                let (engine_slot, fresh_id) = engine.entry(b.block_id.0);
                if !fresh_id {
                    let old = *engine_slot;
                    let r = p.records.all[old as usize];
                    if r.is_live() && r.hash() == hash {
                        prev = Some(old);
                        continue; // duplicate event: already recorded
                    }
                    // The engine reused an id for other content: the old block is gone
                    // (the pair too, unless another id holds the same hash here).
                    if !release_copy(extra_copies, old) {
                        drop_holder(p.reborrow(), old, slot.0);
                        counts.removed += 1;
                    }
                }
                let (record, already) = match p.find(prev, hash) {
                    Some(i) => {
                        let r = &mut p.records.all[i as usize];
                        let (grown, had) = p.sets.insert(r.holders(), slot.0);
                        r.set_holders(grown);
                        (i, had)
                    }
                    None => {
                        // A new record is a head unless it lands right after its parent's
                        // live record. (An engine id reused within this event may have just
                        // dropped the parent's: a record after a dead one is never promoted,
                        // and would be unreachable.)
                        let at = p.records.all.len() as u32;
                        let after_live_parent = prev
                            .is_some_and(|r| r + 1 == at && p.records.all[r as usize].is_live());
                        let head = every_hash || !after_live_parent;
                        let i = p
                            .records
                            .push(Record::new(hash, PackedSet::one(slot.0), head));
                        if head {
                            // Replaces an entry left pointing at a dead record, if any.
                            p.holders.insert(hash, i);
                        }
                        (i, false)
                    }
                };
                *engine_slot = record;
                prev = Some(record);
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
                        &mut self.holders,
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
        if self.pairs == 0 {
            // No live record is left to be reached only through the table: a table of heads
            // only is right again (after every worker was cleared, say for a resync).
            self.every_hash = false;
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

    /// Number of workers holding `hash`, a head's (a prompt's first block, say).
    #[cfg(test)]
    fn holders_of(&self, hash: SequenceHash) -> usize {
        self.lookup(hash.0).map_or(0, |i| {
            self.sets.count(self.records.all[i as usize].holders())
        })
    }

    /// The live record of `hash` if it is a head (the table may point at a dead one, see
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
            table_hashes: self.holders.len() as u64,
            every_hash: self.every_hash,
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
    pending: &'a mut Vec<(u64, u32)>,
}

impl Parts<'_> {
    fn reborrow(&mut self) -> Parts<'_> {
        Parts {
            holders: self.holders,
            records: self.records,
            sets: self.sets,
            pairs: self.pairs,
            pending: self.pending,
        }
    }

    /// The live record of `hash`, whose parent's record is `prev` (`None`: no parent, or an
    /// unknown one while every hash is kept): the record right after the parent's if that
    /// is it, else a head's.
    #[inline(always)]
    fn find(&self, prev: Option<u32>, hash: u64) -> Option<u32> {
        let all: &[Record] = &self.records.all;
        let follows = prev.map(|r| r + 1).filter(|&i| {
            all.get(i as usize)
                .is_some_and(|r| r.is_live() && r.hash() == hash)
        });
        follows.or_else(|| {
            self.holders
                .get(hash)
                .filter(|&i| all[i as usize].is_live())
        })
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
/// A dying head's hash stays in the hash table, pointing at the dead record, and goes on the
/// pending list; [`KvIndex::flush_dead`] removes a few thousand at once, their cache misses
/// overlapped. Meanwhile every lookup checks that the record it reaches is live. Removing it
/// here was a probe of a random line of a table of tens of MB per dying block when the table
/// held every hash, its miss on the removal's path.
fn drop_holder(p: Parts<'_>, record: u32, slot: u16) {
    let mut d = Dropped::default();
    drop_holder_in(
        &mut p.records.all,
        p.sets,
        p.holders,
        record,
        slot,
        &mut d,
        p.pending,
    );
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
///
/// A record that dies makes a head of the record after it if that one was reached only by
/// stepping from it (it is its child, see the module docs).
#[inline(always)]
fn drop_holder_in(
    all: &mut [Record],
    sets: &mut SetArena,
    holders: &mut U64Table,
    record: u32,
    slot: u16,
    d: &mut Dropped,
    pending: &mut Vec<(u64, u32)>,
) {
    let r = &mut all[record as usize];
    if !r.is_live() {
        return;
    }
    let (new, had) = sets.remove(r.holders(), slot);
    d.pairs += u64::from(had);
    let Some(set) = new else {
        if r.is_head() {
            pending.push((r.hash(), record));
        }
        *r = Record::dead();
        d.dead += 1;
        promote_child(all, holders, record);
        return;
    };
    r.set_holders(set);
}

/// After `record` died: the record after it, if it was its child (not a head: reached only by
/// stepping from it), becomes a head.
#[inline(always)]
fn promote_child(all: &mut [Record], holders: &mut U64Table, record: u32) {
    if let Some(child) = all.get_mut(record as usize + 1) {
        if child.is_live() && !child.is_head() {
            child.mark_head();
            holders.insert(child.hash(), record + 1);
        }
    }
}
