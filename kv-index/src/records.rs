//! The block records: one per distinct sequence hash, `(hash, holders)`, 12 bytes, in one
//! vector in the order blocks were first stored.
//!
//! Why a separate vector rather than the sets in the hash table: a `Stored` event is a chain
//! of consecutive blocks, so its records sit side by side, and a query that follows a cached
//! conversation reads them sequentially, checking "is the next record the next prompt
//! block?" instead of hashing and probing a table 512 times (one cache miss each at scale).
//! The hash table (`sequence hash -> record index`) is only consulted where the prompt leaves
//! a stored chain.
//!
//! A record whose last holder leaves is marked dead; when dead records reach a quarter of
//! the live ones the vector is compacted (order kept, so chains stay contiguous) and every
//! index pointing into it is rewritten through a remapping table.
//!
//! A record is a *head* when its hash is in the index's hash table: when the record before it
//! is not its parent block, so that a query or a store cannot reach it by stepping from its
//! parent's record (see `KvIndex`'s docs). Most records are not: a `Stored` event's blocks
//! are appended one after the other.
//!
//! Once the vector reaches [`MAP_MIN_BYTES`] it lives on 2 MiB pages (`super::pages`), like
//! the hash table: a query's jump into a chain is a random access into ~50 MB of records.

use std::ops::{Deref, DerefMut};

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::pages::{HugeMap, MAP_MIN_BYTES};
use super::worker_set::PackedSet;

/// `set` value of a dead record (an arena index no arena reaches).
pub(crate) const DEAD: PackedSet = PackedSet(u32::MAX);

/// Bit of `set` that marks a head (a bit no set uses: inline sets take 30 bits, arena ones the
/// tag bit and 30 bits of index, see `worker_set`).
const HEAD: u32 = 1 << 30;

/// Dead records below which compaction is not worth a pass (tiny in tests, so property tests
/// exercise it).
const MIN_DEAD: usize = if cfg!(test) { 4 } else { 1024 };

/// One block: its sequence hash and who holds it. The zerocopy traits let a mapping be viewed
/// as records.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub(crate) struct Record {
    hash_lo: u32,
    hash_hi: u32,
    /// Holders, plus the [`HEAD`] bit; or [`DEAD`].
    set: PackedSet,
}

impl Record {
    pub(crate) fn new(hash: u64, holders: PackedSet, head: bool) -> Self {
        Record {
            hash_lo: hash as u32,
            hash_hi: (hash >> 32) as u32,
            set: PackedSet(holders.0 | if head { HEAD } else { 0 }),
        }
    }

    /// A dead record: hash 0, no holders.
    pub(crate) const fn dead() -> Self {
        Record {
            hash_lo: 0,
            hash_hi: 0,
            set: DEAD,
        }
    }

    /// Who holds the block (meaningless for a dead record, whose set no arena reaches).
    #[inline(always)]
    pub(crate) fn holders(&self) -> PackedSet {
        PackedSet(self.set.0 & !HEAD)
    }

    /// Replaces the holders, keeping the head bit.
    #[inline(always)]
    pub(crate) fn set_holders(&mut self, holders: PackedSet) {
        self.set = PackedSet(holders.0 | (self.set.0 & HEAD));
    }

    /// Whether the record's hash is in the hash table (a live record only).
    #[inline(always)]
    pub(crate) fn is_head(&self) -> bool {
        self.set.0 & HEAD != 0
    }

    /// Marks a live record as a head (its hash is going into the hash table).
    #[inline(always)]
    pub(crate) fn mark_head(&mut self) {
        self.set.0 |= HEAD;
    }

    #[inline]
    pub(crate) fn hash(&self) -> u64 {
        u64::from(self.hash_lo) | (u64::from(self.hash_hi) << 32)
    }

    #[inline]
    pub(crate) fn is_live(&self) -> bool {
        self.set != DEAD
    }
}

/// Bytes of one record.
const RECORD_BYTES: usize = std::mem::size_of::<Record>();

/// A growable vector of records: a `Vec` while small, then a huge-page mapping (see the
/// module docs). Read and written as a slice (`Deref`); take the slice once per loop, since
/// each deref of a mapping checks its layout.
#[derive(Default)]
pub(crate) struct RecordVec {
    /// `Some` once the records moved to a mapping; `heap` is then empty.
    map: Option<HugeMap>,
    heap: Vec<Record>,
    /// Records in the mapping.
    mapped_len: usize,
}

impl std::fmt::Debug for RecordVec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RecordVec({} records)", self.len())
    }
}

impl RecordVec {
    /// An empty vector with room for `n` records.
    pub(crate) fn with_capacity(n: usize) -> Self {
        let mut v = RecordVec::default();
        v.grow_to(n);
        v
    }

    /// Number of records (without viewing the mapping, unlike the slice's `len`).
    #[inline]
    pub(crate) fn len(&self) -> usize {
        match self.map {
            Some(_) => self.mapped_len,
            None => self.heap.len(),
        }
    }

    /// Records that fit without moving.
    #[inline]
    pub(crate) fn capacity(&self) -> usize {
        match self.map {
            Some(ref map) => map.len() / RECORD_BYTES,
            None => self.heap.capacity(),
        }
    }

    /// Makes room for `additional` more records, exactly (plus the rest of a huge page).
    pub(crate) fn reserve_exact(&mut self, additional: usize) {
        let need = self.len() + additional;
        if need > self.capacity() {
            self.grow_to(need);
        }
    }

    /// Makes room for `additional` more records; when that moves the vector, it grows by at
    /// least a quarter. The router reserves once per worker that registers, each time for
    /// that worker's KV capacity: grown to exactly each request, every registration moved
    /// (and faulted in) all the records reserved before it again, quadratic in the fleet (a
    /// 256-worker fleet mapped and copied tens of gigabytes while it registered, and its
    /// heartbeats waited behind that until workers expired and registered again).
    pub(crate) fn reserve(&mut self, additional: usize) {
        let need = self.len() + additional;
        let have = self.capacity();
        if need > have {
            self.grow_to(need.max(have + have / 4));
        }
    }

    /// [`RecordVec::reserve`], and writes the spare capacity once so that its pages are
    /// faulted in now rather than by the pushes (a mapping is faulted in when created).
    pub(crate) fn reserve_and_fault_in(&mut self, additional: usize) {
        self.reserve(additional);
        if self.map.is_none() {
            let len = self.heap.len();
            self.heap.resize(self.heap.capacity(), Record::dead());
            self.heap.truncate(len);
        }
    }

    fn grow_to(&mut self, capacity: usize) {
        if capacity * RECORD_BYTES >= MAP_MIN_BYTES {
            if let Some(mut map) = HugeMap::new(capacity * RECORD_BYTES) {
                let old: &[Record] = self;
                let bytes = old.as_bytes();
                map.bytes_mut()[..bytes.len()].copy_from_slice(bytes);
                self.mapped_len = old.len();
                self.map = Some(map);
                self.heap = Vec::new();
                return;
            }
        }
        if self.map.is_some() {
            // Mapping a bigger one failed: back to the heap.
            self.heap = self.to_vec();
            self.map = None;
        }
        self.heap.reserve_exact(capacity - self.heap.len());
    }

    /// Appends `r`.
    #[inline(always)]
    pub(crate) fn push(&mut self, r: Record) {
        match &mut self.map {
            None => self.heap.push(r),
            Some(map) => {
                let at = self.mapped_len * RECORD_BYTES;
                map.bytes_mut()[at..at + RECORD_BYTES].copy_from_slice(r.as_bytes());
                self.mapped_len += 1;
            }
        }
    }
}

impl Deref for RecordVec {
    type Target = [Record];

    #[inline(always)]
    fn deref(&self) -> &[Record] {
        match &self.map {
            None => &self.heap,
            Some(map) => <[Record]>::ref_from_bytes(&map.bytes()[..self.mapped_len * RECORD_BYTES])
                .expect("a mapping starts on a page and holds whole records"),
        }
    }
}

impl DerefMut for RecordVec {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut [Record] {
        match &mut self.map {
            None => &mut self.heap,
            Some(map) => {
                <[Record]>::mut_from_bytes(&mut map.bytes_mut()[..self.mapped_len * RECORD_BYTES])
                    .expect("a mapping starts on a page and holds whole records")
            }
        }
    }
}

/// The record vector with its dead count.
#[derive(Debug, Default)]
pub(crate) struct Records {
    pub(crate) all: RecordVec,
    pub(crate) dead: usize,
}

impl Records {
    /// Appends a record; grows the vector by a quarter at a time (not doubling) so that at
    /// most 20 % of its memory is spare. Always inlined: it runs once per new block.
    #[inline(always)]
    pub(crate) fn push(&mut self, r: Record) -> u32 {
        let len = self.all.len();
        if len == self.all.capacity() {
            self.all.reserve_exact((len / 4).max(64));
        }
        self.all.push(r);
        len as u32
    }

    /// Marks record `i` dead (the index does it in place, see `drop_holder_in`).
    #[cfg(test)]
    pub(crate) fn kill(&mut self, i: u32) {
        self.all[i as usize] = Record::dead();
        self.dead += 1;
    }

    /// Whether enough records died that compacting pays.
    pub(crate) fn should_compact(&self) -> bool {
        self.dead > MIN_DEAD && self.dead * 4 > self.all.len() - self.dead
    }

    /// Drops dead records, keeping order; returns the map from old to new indices for the
    /// caller to rewrite its pointers.
    pub(crate) fn compact(&mut self) -> Remap {
        let live = self.all.len() - self.dead;
        let mut remap = Remap {
            live: vec![0; self.all.len().div_ceil(64)],
            before: Vec::with_capacity(self.all.len().div_ceil(64)),
        };
        let mut kept = RecordVec::with_capacity(live + live / 4);
        for (word, chunk) in self.all.chunks(64).enumerate() {
            remap.before.push(kept.len() as u32);
            for (bit, r) in chunk.iter().enumerate() {
                if r.is_live() {
                    remap.live[word] |= 1 << bit;
                    kept.push(*r);
                }
            }
        }
        self.all = kept;
        self.dead = 0;
        remap
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.all.capacity() * RECORD_BYTES
    }
}

/// Old record index -> new one after a compaction, as a rank structure (a live bit per old
/// record plus the live count before every 64 records): 1.1 bits per record instead of a
/// 32-bit table, so the lookups done while rewriting millions of pointers hit cache.
pub(crate) struct Remap {
    live: Vec<u64>,
    before: Vec<u32>,
}

impl Remap {
    /// Whether old record `i` was live (kept).
    #[inline]
    pub(crate) fn is_live(&self, i: u32) -> bool {
        self.live[i as usize / 64] & (1 << (i % 64)) != 0
    }

    /// The new index of live old record `i`.
    #[inline]
    pub(crate) fn get(&self, i: u32) -> u32 {
        let (word, bit) = (i as usize / 64, i % 64);
        let below = self.live[word] & ((1u64 << bit) - 1);
        self.before[word] + below.count_ones()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Capacity reserved one worker at a time (the router's reservation at each registration)
    /// moves the vector a logarithmic number of times, not once per worker.
    #[test]
    fn reserving_worker_by_worker_moves_the_records_a_few_times_not_once_each() {
        const WORKERS: usize = 256;
        // Small enough per worker that the whole stays on the heap, where capacities are
        // exact and every move is visible.
        let per_worker = MAP_MIN_BYTES / RECORD_BYTES / WORKERS / 2;
        let mut records = Records::default();
        let mut moves = 0;
        for worker in 1..=WORKERS {
            let before = records.all.capacity();
            let missing = worker * per_worker - records.all.len();
            records.all.reserve_and_fault_in(missing);
            assert!(records.all.capacity() >= worker * per_worker);
            moves += usize::from(records.all.capacity() != before);
            // The worker's blocks arrive before the next one registers.
            for i in 0..per_worker as u64 {
                records.push(Record::new(i, PackedSet(0), false));
            }
        }
        assert!(records.all.map.is_none());
        // Growing by a quarter from one worker's share to 256 of them: ~25 moves.
        assert!(moves <= 32, "{moves} moves for {WORKERS} reservations");
    }

    /// Records pushed past the mapping threshold move to a mapping and keep their contents;
    /// compaction of a mapped vector keeps the live ones in order.
    #[test]
    fn a_mapped_record_vector_keeps_its_records() {
        let n = MAP_MIN_BYTES / RECORD_BYTES + 1000;
        let mut records = Records::default();
        for i in 0..n as u64 {
            assert_eq!(
                records.push(Record::new(i * 7 + 1, PackedSet(i as u32), i % 2 == 0)),
                i as u32
            );
        }
        assert!(records.all.map.is_some());
        assert_eq!(records.all.len(), n);
        assert!(records.heap_bytes() >= n * RECORD_BYTES);
        for i in (0..n as u32).filter(|i| i % 3 == 0) {
            records.kill(i);
        }
        let remap = records.compact();
        let live: Vec<u32> = (0..n as u32).filter(|i| i % 3 != 0).collect();
        assert_eq!(records.all.len(), live.len());
        for (new, &old) in live.iter().enumerate() {
            let r = records.all[new];
            assert_eq!(remap.get(old), new as u32);
            assert_eq!(
                (r.hash(), r.holders(), r.is_head()),
                (u64::from(old) * 7 + 1, PackedSet(old), old % 2 == 0)
            );
        }
    }
}
