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

use super::worker_set::PackedSet;

/// `set` value of a dead record (an arena index no arena reaches).
pub(crate) const DEAD: PackedSet = PackedSet(u32::MAX);

/// Dead records below which compaction is not worth a pass (tiny in tests, so property tests
/// exercise it).
const MIN_DEAD: usize = if cfg!(test) { 4 } else { 1024 };

/// One block: its sequence hash and who holds it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Record {
    hash_lo: u32,
    hash_hi: u32,
    /// Holders, or [`DEAD`].
    pub(crate) set: PackedSet,
}

impl Record {
    pub(crate) fn new(hash: u64, set: PackedSet) -> Self {
        Record {
            hash_lo: hash as u32,
            hash_hi: (hash >> 32) as u32,
            set,
        }
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

/// The record vector with its dead count.
#[derive(Debug, Default)]
pub(crate) struct Records {
    pub(crate) all: Vec<Record>,
    pub(crate) dead: usize,
}

impl Records {
    /// Appends a record; grows the vector by a quarter at a time (not doubling) so that at
    /// most 20 % of its memory is spare.
    pub(crate) fn push(&mut self, r: Record) -> u32 {
        if self.all.len() == self.all.capacity() {
            self.all.reserve_exact((self.all.len() / 4).max(64));
        }
        self.all.push(r);
        (self.all.len() - 1) as u32
    }

    /// Marks record `i` dead.
    pub(crate) fn kill(&mut self, i: u32) {
        self.all[i as usize] = Record::new(0, DEAD);
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
        let mut kept = Vec::with_capacity(live + live / 4);
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
        self.all.capacity() * std::mem::size_of::<Record>()
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
    /// The new index of live old record `i`.
    #[inline]
    pub(crate) fn get(&self, i: u32) -> u32 {
        let (word, bit) = (i as usize / 64, i % 64);
        let below = self.live[word] & ((1u64 << bit) - 1);
        self.before[word] + below.count_ones()
    }
}
