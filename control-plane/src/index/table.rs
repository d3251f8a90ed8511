//! A compact open-addressing hash table from `u64` keys to small `Copy` values.
//!
//! Why not `std::collections::HashMap`: its bucket count is a power of two, so right after
//! it grows the table is less than half full, and at the KV index's scale (millions of
//! (worker, block) pairs) that costs ~2x memory; its default hasher (SipHash) is also slow for
//! keys that are already hashes. This table uses linear probing over a bucket count of any
//! size (Lemire's multiply-shift range reduction), grows by 1.25x at 80 % load (so it is
//! always 64-80 % full), stores key and value side by side (one cache miss per lookup), and
//! deletes by backward shifting (no tombstones, so lookups stay short under churn).
//!
//! Key `0` marks an empty bucket; a real key `0` lives in a side slot.

/// Load factor above which the table grows, as a fraction `GROW_NUM / GROW_DEN`.
const MAX_LOAD_NUM: usize = 4;
const MAX_LOAD_DEN: usize = 5;
/// Smallest bucket count.
const MIN_BUCKETS: usize = 8;

/// Scrambles a key so that sequential engine ids spread as well as real hashes do: one
/// multiplication by an odd constant (Fibonacci hashing) makes the high bits, which the range
/// reduction below uses, depend on every bit of the key. Sequence hashes are already uniform;
/// this costs them one cycle.
#[inline]
fn mix(key: u64) -> u64 {
    key.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Home bucket of `key` in a table of `buckets` buckets.
#[inline]
fn home(key: u64, buckets: usize) -> usize {
    ((u128::from(mix(key)) * buckets as u128) >> 64) as usize
}

/// One bucket: the key split in two `u32`s so that a `u32` value packs into 12 bytes.
#[derive(Clone, Copy, Default)]
struct Bucket<V> {
    key_lo: u32,
    key_hi: u32,
    val: V,
}

impl<V: Copy> Bucket<V> {
    #[inline]
    fn key(&self) -> u64 {
        u64::from(self.key_lo) | (u64::from(self.key_hi) << 32)
    }
}

/// The table. See the module docs.
#[derive(Clone)]
pub(crate) struct U64Table<V> {
    buckets: Vec<Bucket<V>>,
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

impl<V: Copy + Default> U64Table<V> {
    /// An empty table (allocates nothing).
    pub(crate) fn new() -> Self {
        U64Table {
            buckets: Vec::new(),
            len: 0,
            zero: None,
        }
    }

    /// An empty table sized for `n` keys without growing.
    pub(crate) fn with_capacity(n: usize) -> Self {
        let mut t = Self::new();
        if n > 0 {
            t.rehash((n * MAX_LOAD_DEN / MAX_LOAD_NUM + 1).max(MIN_BUCKETS));
        }
        t
    }

    /// Makes room for `additional` more keys without growing.
    pub(crate) fn reserve(&mut self, additional: usize) {
        let need = (self.len + additional) * MAX_LOAD_DEN / MAX_LOAD_NUM + 1;
        if need > self.buckets.len() {
            // Grow at least geometrically, so that many small reservations (one per worker
            // registering) cost a few rehashes, not one each.
            let grown = self.buckets.len() + self.buckets.len() / 4;
            self.rehash(need.max(grown).max(MIN_BUCKETS));
        }
    }

    /// Number of keys.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Bytes held (buckets only; the struct itself is a few words).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.buckets.capacity() * std::mem::size_of::<Bucket<V>>()
    }

    /// Bucket index of `key` if present (`key != 0`).
    #[inline]
    fn find(&self, key: u64) -> Option<usize> {
        let n = self.buckets.len();
        if n == 0 {
            return None;
        }
        let mut i = home(key, n);
        loop {
            let k = self.buckets[i].key();
            if k == key {
                return Some(i);
            }
            if k == 0 {
                return None;
            }
            i += 1;
            if i == n {
                i = 0;
            }
        }
    }

    /// Loads the home bucket of every key, without branching on the result, so that their
    /// cache misses overlap (memory-level parallelism); the caller then looks them up while
    /// they are in flight or cached. Returns a value that the caller must consume with
    /// `std::hint::black_box` so the loads are not optimised away.
    #[inline]
    pub(crate) fn touch(&self, keys: impl Iterator<Item = u64>) -> u32 {
        let n = self.buckets.len();
        if n == 0 {
            return 0;
        }
        keys.fold(0, |acc, k| acc ^ self.buckets[home(k, n)].key_lo)
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
        if (self.len + 1) * MAX_LOAD_DEN > self.buckets.len() * MAX_LOAD_NUM {
            let grown = (self.buckets.len() + self.buckets.len() / 4).max(MIN_BUCKETS);
            self.rehash(grown);
        }
        let n = self.buckets.len();
        let mut i = home(key, n);
        loop {
            let k = self.buckets[i].key();
            if k == key {
                return (&mut self.buckets[i].val, false);
            }
            if k == 0 {
                self.buckets[i] = Bucket {
                    key_lo: key as u32,
                    key_hi: (key >> 32) as u32,
                    val: V::default(),
                };
                self.len += 1;
                return (&mut self.buckets[i].val, true);
            }
            i += 1;
            if i == n {
                i = 0;
            }
        }
    }

    /// The value of `key`.
    #[inline]
    pub(crate) fn get(&self, key: u64) -> Option<V> {
        if key == 0 {
            return self.zero;
        }
        self.find(key).map(|i| self.buckets[i].val)
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
        let mut hole = self.find(key)?;
        let val = self.buckets[hole].val;
        self.len -= 1;
        // Backward-shift deletion: pull later entries of the cluster into the hole when the
        // hole lies on their probe path, so no tombstone is needed.
        let n = self.buckets.len();
        let mut j = hole;
        loop {
            j += 1;
            if j == n {
                j = 0;
            }
            let k = self.buckets[j].key();
            if k == 0 {
                break;
            }
            // Cyclic distances back from j (no `%`: a division per step costs more than the
            // probe itself).
            let back = |from: usize| if j >= from { j - from } else { j + n - from };
            let dist_home = back(home(k, n));
            let dist_hole = back(hole);
            if dist_home >= dist_hole {
                self.buckets[hole] = self.buckets[j];
                hole = j;
            }
        }
        self.buckets[hole] = Bucket::default();
        if self.len == 0 {
            // Release memory of tables that emptied (a cleared worker).
            self.buckets = Vec::new();
        }
        Some(val)
    }

    /// Rewrites every value in place (keys, and so positions, stay).
    pub(crate) fn for_each_value_mut(&mut self, mut f: impl FnMut(&mut V)) {
        if let Some(v) = self.zero.as_mut() {
            f(v);
        }
        for b in &mut self.buckets {
            if b.key() != 0 {
                f(&mut b.val);
            }
        }
    }

    /// Every (key, value).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, V)> + '_ {
        self.zero.map(|v| (0, v)).into_iter().chain(
            self.buckets
                .iter()
                .filter(|b| b.key() != 0)
                .map(|b| (b.key(), b.val)),
        )
    }

    fn rehash(&mut self, buckets: usize) {
        let old = std::mem::replace(&mut self.buckets, vec![Bucket::default(); buckets]);
        for b in old {
            let k = b.key();
            if k == 0 {
                continue;
            }
            let mut i = home(k, buckets);
            while self.buckets[i].key() != 0 {
                i += 1;
                if i == buckets {
                    i = 0;
                }
            }
            self.buckets[i] = b;
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
                let load = t.len() as f64 / t.buckets.len() as f64;
                assert!((0.63..=0.8).contains(&load), "load {load} at {k}");
            }
        }
    }

    #[test]
    fn u32_values_pack_into_12_bytes() {
        assert_eq!(std::mem::size_of::<Bucket<u32>>(), 12);
        assert_eq!(std::mem::size_of::<Bucket<u64>>(), 16);
    }
}
