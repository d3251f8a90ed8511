//! A compact open-addressing hash table from `u64` keys to small `Copy` values.
//!
//! Why not `std::collections::HashMap`: its bucket count is a power of two, so right after
//! it grows the table is less than half full, and at the KV index's scale (millions of
//! (worker, block) pairs) that costs ~2x memory; its default hasher (SipHash) is also slow for
//! keys that are already hashes.
//!
//! Layout: the table is an array of 64-byte, cache-line-aligned *lines* of five slots (five
//! keys, five values, and an overflow count). A key lives in its home line, or, when that
//! line was full at insertion, in one of the following lines; every line it passed counts it
//! in `overflow`. So:
//! - a lookup reads one cache line unless its home line has overflowed (rare below 80 %
//!   load), and a lookup of an absent key stops at the first line with `overflow == 0`;
//!   plain linear probing over 12-byte buckets reads 2-3 lines for an absent key at 80 %
//!   load, which at millions of keys is 2-3 cache and TLB misses;
//! - a removal clears its slot and decrements the counts on its path: no backward shift
//!   (which at 80 % load walks a dozen buckets, computing each one's home), no tombstones.
//!
//! The line count is any size (Lemire's multiply-shift range reduction), growing by 1.25x at
//! 80 % load, so the table is always 64-80 % full: 16-20 bytes per `u32`-valued key.
//!
//! Key `0` marks an empty slot; a real key `0` lives in a side slot.

/// Load factor above which the table grows, as a fraction `MAX_LOAD_NUM / MAX_LOAD_DEN`.
const MAX_LOAD_NUM: usize = 4;
const MAX_LOAD_DEN: usize = 5;
/// Slots per line: five `u64` keys, five `u32` values and a `u32` count fill 64 bytes.
const SLOTS: usize = 5;
/// Smallest line count.
const MIN_LINES: usize = 2;

/// Scrambles a key so that sequential engine ids spread as well as real hashes do: one
/// multiplication by an odd constant (Fibonacci hashing) makes the high bits, which the range
/// reduction below uses, depend on every bit of the key. Sequence hashes are already uniform;
/// this costs them one cycle.
#[inline]
fn mix(key: u64) -> u64 {
    key.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Home line of `key` in a table of `lines` lines.
#[inline]
fn home(key: u64, lines: usize) -> usize {
    ((u128::from(mix(key)) * lines as u128) >> 64) as usize
}

/// One cache line of slots (see the module docs).
#[derive(Clone, Copy, Default)]
#[repr(C, align(64))]
struct Line<V> {
    keys: [u64; SLOTS],
    vals: [V; SLOTS],
    /// Keys stored after this line whose probe passed it.
    overflow: u32,
}

impl<V> Line<V> {
    #[inline]
    fn slot_of(&self, key: u64) -> Option<usize> {
        self.keys.iter().position(|&k| k == key)
    }
}

/// The table. See the module docs.
#[derive(Clone)]
pub(crate) struct U64Table<V> {
    lines: Vec<Line<V>>,
    len: usize,
    zero: Option<V>,
}

impl<V> std::fmt::Debug for U64Table<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "U64Table({} keys)", self.len)
    }
}

impl<V: Copy + Default> Default for U64Table<V> {
    fn default() -> Self {
        Self::new()
    }
}

/// Lines needed to hold `keys` keys at no more than the maximum load.
fn lines_for(keys: usize) -> usize {
    (keys * MAX_LOAD_DEN / MAX_LOAD_NUM).div_ceil(SLOTS) + 1
}

impl<V: Copy + Default> U64Table<V> {
    /// An empty table (allocates nothing).
    pub(crate) fn new() -> Self {
        U64Table {
            lines: Vec::new(),
            len: 0,
            zero: None,
        }
    }

    /// An empty table sized for `n` keys without growing.
    pub(crate) fn with_capacity(n: usize) -> Self {
        let mut t = Self::new();
        if n > 0 {
            t.rehash(lines_for(n).max(MIN_LINES));
        }
        t
    }

    /// Makes room for `additional` more keys without growing.
    pub(crate) fn reserve(&mut self, additional: usize) {
        let need = lines_for(self.len + additional);
        if need > self.lines.len() {
            // Grow at least geometrically, so that many small reservations (one per worker
            // registering) cost a few rehashes, not one each.
            let grown = self.lines.len() + self.lines.len() / 4;
            self.rehash(need.max(grown).max(MIN_LINES));
        }
    }

    /// Number of keys.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Number of slots (for load-factor tests).
    #[cfg(test)]
    fn slots(&self) -> usize {
        self.lines.len() * SLOTS
    }

    /// Bytes held (lines only; the struct itself is a few words).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.lines.capacity() * std::mem::size_of::<Line<V>>()
    }

    #[inline]
    fn next(&self, l: usize) -> usize {
        if l + 1 == self.lines.len() {
            0
        } else {
            l + 1
        }
    }

    /// (line, slot) of `key` if present (`key != 0`).
    #[inline]
    fn find(&self, key: u64) -> Option<(usize, usize)> {
        let n = self.lines.len();
        if n == 0 {
            return None;
        }
        let mut l = home(key, n);
        // Bounded by the line count: overflow counts could in theory cover the whole ring.
        for _ in 0..n {
            let line = &self.lines[l];
            if let Some(s) = line.slot_of(key) {
                return Some((l, s));
            }
            if line.overflow == 0 {
                return None;
            }
            l = self.next(l);
        }
        None
    }

    /// Loads the home line of every key, without branching on the result, so that their
    /// cache misses overlap (memory-level parallelism); the caller then looks them up while
    /// they are in flight or cached. Returns a value that the caller must consume with
    /// `std::hint::black_box` so the loads are not optimised away.
    #[inline]
    pub(crate) fn touch(&self, keys: impl Iterator<Item = u64>) -> u32 {
        let n = self.lines.len();
        if n == 0 {
            return 0;
        }
        keys.fold(0, |acc, k| acc ^ self.lines[home(k, n)].overflow)
    }

    /// Puts a key known to be absent into the first free slot from its home line on, counting
    /// it in the lines it passes.
    fn place(&mut self, key: u64, val: V) -> (usize, usize) {
        let n = self.lines.len();
        let start = home(key, n);
        let mut l = start;
        let s = loop {
            if let Some(s) = self.lines[l].slot_of(0) {
                break s;
            }
            l = self.next(l);
        };
        let mut x = start;
        while x != l {
            self.lines[x].overflow += 1;
            x = self.next(x);
        }
        self.lines[l].keys[s] = key;
        self.lines[l].vals[s] = val;
        self.len += 1;
        (l, s)
    }

    /// The value of `key`, inserting `V::default()` if absent; `true` when inserted. One
    /// probe instead of a `get` then an `insert`.
    pub(crate) fn entry(&mut self, key: u64) -> (&mut V, bool) {
        if key == 0 {
            let inserted = self.zero.is_none();
            if inserted {
                self.len += 1;
            }
            return (self.zero.get_or_insert_with(V::default), inserted);
        }
        if (self.len + 1) * MAX_LOAD_DEN > self.lines.len() * SLOTS * MAX_LOAD_NUM {
            let grown = (self.lines.len() + self.lines.len() / 4)
                .max(lines_for(self.len + 1))
                .max(MIN_LINES);
            self.rehash(grown);
        }
        // Common case in one pass over the home line: the key is there, or it is not and
        // nothing overflowed from it, so it goes into the line's first free slot.
        let n = self.lines.len();
        let l = home(key, n);
        let line = &mut self.lines[l];
        // Both scans without a branch per slot (conditional moves), lowest slot first.
        let (mut hit, mut free) = (SLOTS, SLOTS);
        for s in (0..SLOTS).rev() {
            if line.keys[s] == key {
                hit = s;
            }
            if line.keys[s] == 0 {
                free = s;
            }
        }
        if hit < SLOTS {
            return (&mut self.lines[l].vals[hit], false);
        }
        if free < SLOTS && line.overflow == 0 {
            line.keys[free] = key;
            line.vals[free] = V::default();
            self.len += 1;
            return (&mut self.lines[l].vals[free], true);
        }
        let (l, s) = match self.find(key) {
            Some(at) => return (&mut self.lines[at.0].vals[at.1], false),
            None => self.place(key, V::default()),
        };
        (&mut self.lines[l].vals[s], true)
    }

    /// The value of `key`.
    #[inline]
    pub(crate) fn get(&self, key: u64) -> Option<V> {
        if key == 0 {
            return self.zero;
        }
        self.find(key).map(|(l, s)| self.lines[l].vals[s])
    }

    /// Inserts or replaces; returns the previous value.
    pub(crate) fn insert(&mut self, key: u64, val: V) -> Option<V> {
        match self.entry(key) {
            (slot, true) => {
                *slot = val;
                None
            }
            (slot, false) => Some(std::mem::replace(slot, val)),
        }
    }

    /// Removes `key`; returns its value.
    pub(crate) fn remove(&mut self, key: u64) -> Option<V> {
        if key == 0 {
            let old = self.zero.take();
            if old.is_some() {
                self.len -= 1;
            }
            return old;
        }
        let (l, s) = self.find(key)?;
        let val = self.lines[l].vals[s];
        self.lines[l].keys[s] = 0;
        self.len -= 1;
        let mut x = home(key, self.lines.len());
        while x != l {
            self.lines[x].overflow -= 1;
            x = self.next(x);
        }
        if self.len == 0 {
            // Release memory of tables that emptied (a cleared worker).
            self.lines = Vec::new();
        }
        Some(val)
    }

    /// Rewrites every value in place (keys, and so positions, stay).
    pub(crate) fn for_each_value_mut(&mut self, mut f: impl FnMut(&mut V)) {
        if let Some(v) = self.zero.as_mut() {
            f(v);
        }
        for line in &mut self.lines {
            for (k, v) in line.keys.iter().zip(&mut line.vals) {
                if *k != 0 {
                    f(v);
                }
            }
        }
    }

    /// Every (key, value).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, V)> + '_ {
        self.zero.map(|v| (0, v)).into_iter().chain(
            self.lines
                .iter()
                .flat_map(|line| line.keys.iter().zip(&line.vals))
                .filter(|(k, _)| **k != 0)
                .map(|(k, v)| (*k, *v)),
        )
    }

    fn rehash(&mut self, lines: usize) {
        let old = std::mem::replace(&mut self.lines, vec![Line::default(); lines]);
        self.len = usize::from(self.zero.is_some());
        for line in old {
            for (k, v) in line.keys.into_iter().zip(line.vals) {
                if k != 0 {
                    self.place(k, v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    proptest::proptest! {
        #[test]
        fn behaves_like_a_hash_map(
            ops in proptest::collection::vec((0u8..3, 0u64..64, proptest::num::u32::ANY), 0..600)
        ) {
            let mut t: U64Table<u32> = U64Table::new();
            let mut m: HashMap<u64, u32> = HashMap::new();
            for (op, key, val) in ops {
                // Small keys collide and cluster; shifting them spreads them over the u64 range too.
                let key = if key % 2 == 0 { key } else { key << 40 };
                match op {
                    0 => proptest::prop_assert_eq!(t.insert(key, val), m.insert(key, val)),
                    1 => proptest::prop_assert_eq!(t.remove(key), m.remove(&key)),
                    _ => proptest::prop_assert_eq!(t.get(key), m.get(&key).copied()),
                }
                proptest::prop_assert_eq!(t.len(), m.len());
            }
            for (k, v) in &m {
                proptest::prop_assert_eq!(t.get(*k), Some(*v));
            }
            proptest::prop_assert_eq!(t.iter().count(), m.len());
        }
    }

    #[test]
    fn stays_between_64_and_80_percent_full_while_growing() {
        let mut t: U64Table<u32> = U64Table::new();
        for k in 1..200_000u64 {
            t.insert(k, 1);
            if k > 1_000 {
                let load = t.len() as f64 / t.slots() as f64;
                assert!((0.63..=0.8).contains(&load), "load {load} at {k}");
            }
        }
    }

    #[test]
    fn a_line_is_one_cache_line() {
        assert_eq!(std::mem::size_of::<Line<u32>>(), 64);
        assert_eq!(std::mem::align_of::<Line<u32>>(), 64);
        assert_eq!(std::mem::size_of::<Line<u8>>(), 64);
    }

    proptest::proptest! {
        /// Many keys near the maximum load, so lines overflow and removals must keep the
        /// overflow counts right.
        #[test]
        fn behaves_like_a_hash_map_when_crowded(
            ops in proptest::collection::vec((0u8..4, 0u64..400), 0..3000)
        ) {
            let mut t: U64Table<u32> = U64Table::with_capacity(300);
            let mut m: HashMap<u64, u32> = HashMap::new();
            for (i, (op, key)) in ops.into_iter().enumerate() {
                // Spread over the u64 range, with some keys sharing home lines.
                let key = key.wrapping_mul(0x2545_f491_4f6c_dd1d) >> (key % 3);
                match op {
                    0 | 1 => proptest::prop_assert_eq!(t.insert(key, i as u32), m.insert(key, i as u32)),
                    2 => proptest::prop_assert_eq!(t.remove(key), m.remove(&key)),
                    _ => proptest::prop_assert_eq!(t.get(key), m.get(&key).copied()),
                }
            }
            proptest::prop_assert_eq!(t.len(), m.len());
            for (k, v) in &m {
                proptest::prop_assert_eq!(t.get(*k), Some(*v));
            }
            let overflow: u32 = t.lines.iter().map(|l| l.overflow).sum();
            let displaced: usize = t.iter().filter(|(k, _)| *k != 0).map(|(k, _)| {
                let (l, _) = t.find(k).unwrap();
                let h = home(k, t.lines.len());
                if l >= h { l - h } else { l + t.lines.len() - h }
            }).sum();
            proptest::prop_assert_eq!(overflow as usize, displaced);
        }
    }
}
