//! A compact open-addressing hash table from `u64` keys to `u32` values.
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
//!
//! Pages: a table of at least `MAP_MIN_BYTES` (the KV index's sequence-hash table, tens of
//! MB at millions of blocks) lives on 2 MiB pages (`super::pages`), faulted in when the table
//! is sized (the router sizes it in `KvIndex::reserve_total`), not while events are applied.
//! Smaller tables (the per-worker engine-id tables, ~0.5 MB each, and the load tracker's)
//! stay in a `Vec`. A fresh mapping is zeroed, which is already an empty line.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

#[cfg(test)]
use super::pages::HUGE_PAGE;
use super::pages::{HugeMap, MAP_MIN_BYTES};
use super::prefetch::prefetch;

/// Load factor above which the table grows, as a fraction `MAX_LOAD_NUM / MAX_LOAD_DEN`.
const MAX_LOAD_NUM: usize = 4;
const MAX_LOAD_DEN: usize = 5;
/// Slots per line: five `u64` keys, five `u32` values and a `u32` count fill 64 bytes.
const SLOTS: usize = 5;
/// Smallest line count.
const MIN_LINES: usize = 2;
/// Bytes of one line.
const LINE_BYTES: usize = std::mem::size_of::<Line>();

/// Scrambles a key so that sequential engine ids spread as well as real hashes do: one
/// multiplication by an odd constant (Fibonacci hashing) makes the high bits, which the range
/// reduction below uses, depend on every bit of the key. Sequence hashes are already uniform;
/// this costs them one cycle.
#[inline]
fn mix(key: u64) -> u64 {
    key.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Home line of `key` in a table of `lines` lines. Four consecutive keys share a home line
/// (the key's two low bits are dropped before the mix): engine block ids that an engine
/// numbers sequentially, and that a `Stored` event brings in order, then cost one cache
/// miss per four blocks instead of one each (ingest 2.0x -> 2.2-2.5x Dynamo's in
/// `docs/kv-index-vs-dynamo.md`). Random keys (sequence hashes, vLLM's block hashes used
/// as engine ids) spread exactly as before.
#[inline]
fn home(key: u64, lines: usize) -> usize {
    ((u128::from(mix(key >> 2)) * lines as u128) >> 64) as usize
}

/// The line after `l` in a ring of `n` lines.
#[inline]
fn next(l: usize, n: usize) -> usize {
    if l + 1 == n {
        0
    } else {
        l + 1
    }
}

/// One cache line of slots (see the module docs). All zero bytes is an empty line, which is
/// what a fresh mapping holds. The zerocopy traits let a mapping be viewed as lines.
#[derive(Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C, align(64))]
struct Line {
    keys: [u64; SLOTS],
    vals: [u32; SLOTS],
    /// Keys stored after this line whose probe passed it.
    overflow: u32,
}

impl Line {
    #[inline]
    fn slot_of(&self, key: u64) -> Option<usize> {
        self.keys.iter().position(|&k| k == key)
    }
}

/// Where the lines live (see the module docs).
enum Lines {
    Heap(Vec<Line>),
    /// The first `lines` lines of a mapping (which may hold a few more, unused).
    Mapped {
        map: HugeMap,
        lines: usize,
    },
}

impl Lines {
    /// `n` empty lines.
    fn new(n: usize) -> Self {
        let bytes = n * LINE_BYTES;
        if bytes >= MAP_MIN_BYTES {
            if let Some(map) = HugeMap::new(bytes) {
                return Lines::Mapped { map, lines: n };
            }
        }
        Lines::Heap(vec![Line::default(); n])
    }

    // Always inlined (like the callers below): without it the view's layout check kept
    // `entry` from being inlined into `KvIndex::store`, costing ~10 % of ingest.
    #[inline(always)]
    fn get(&self) -> &[Line] {
        match self {
            Lines::Heap(v) => v,
            Lines::Mapped { map, lines } => {
                <[Line]>::ref_from_bytes(&map.bytes()[..lines * LINE_BYTES])
                    .expect("a mapping starts on a page and holds whole lines")
            }
        }
    }

    #[inline(always)]
    fn get_mut(&mut self) -> &mut [Line] {
        match self {
            Lines::Heap(v) => v,
            Lines::Mapped { map, lines } => {
                <[Line]>::mut_from_bytes(&mut map.bytes_mut()[..*lines * LINE_BYTES])
                    .expect("a mapping starts on a page and holds whole lines")
            }
        }
    }

    /// Bytes of memory the lines take (a mapping counts whole huge pages).
    fn bytes(&self) -> usize {
        match self {
            Lines::Heap(v) => v.capacity() * LINE_BYTES,
            Lines::Mapped { map, .. } => map.len(),
        }
    }

    #[cfg(test)]
    fn is_mapped(&self) -> bool {
        matches!(self, Lines::Mapped { .. })
    }
}

/// (line, slot) of `key` if present (`key != 0`).
#[inline]
fn find(lines: &[Line], key: u64) -> Option<(usize, usize)> {
    let n = lines.len();
    if n == 0 {
        return None;
    }
    let mut l = home(key, n);
    // Bounded by the line count: overflow counts could in theory cover the whole ring.
    for _ in 0..n {
        let line = &lines[l];
        if let Some(s) = line.slot_of(key) {
            return Some((l, s));
        }
        if line.overflow == 0 {
            return None;
        }
        l = next(l, n);
    }
    None
}

/// Puts a key known to be absent into the first free slot from its home line on, counting it
/// in the lines it passes. The caller counts the key.
fn place(lines: &mut [Line], key: u64, val: u32) -> (usize, usize) {
    let n = lines.len();
    let start = home(key, n);
    let mut l = start;
    let s = loop {
        if let Some(s) = lines[l].slot_of(0) {
            break s;
        }
        l = next(l, n);
    };
    let mut x = start;
    while x != l {
        lines[x].overflow += 1;
        x = next(x, n);
    }
    lines[l].keys[s] = key;
    lines[l].vals[s] = val;
    (l, s)
}

/// The table, from `u64` keys to `u32` values (a line's layout fixes them). See the module
/// docs.
pub struct U64Table {
    lines: Lines,
    len: usize,
    /// Key count at which the next insert grows the table (the maximum load of `lines`).
    grow_at: usize,
    zero: Option<u32>,
}

impl std::fmt::Debug for U64Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "U64Table({} keys)", self.len)
    }
}

impl Default for U64Table {
    fn default() -> Self {
        Self::new()
    }
}

/// Lines needed to hold `keys` keys at no more than the maximum load.
fn lines_for(keys: usize) -> usize {
    (keys * MAX_LOAD_DEN / MAX_LOAD_NUM).div_ceil(SLOTS) + 1
}

impl U64Table {
    /// An empty table (allocates nothing).
    pub fn new() -> Self {
        U64Table {
            lines: Lines::Heap(Vec::new()),
            len: 0,
            grow_at: 0,
            zero: None,
        }
    }

    /// An empty table sized for `n` keys without growing.
    pub fn with_capacity(n: usize) -> Self {
        let mut t = Self::new();
        if n > 0 {
            t.rehash(lines_for(n).max(MIN_LINES));
        }
        t
    }

    /// Makes room for `additional` more keys without growing.
    pub fn reserve(&mut self, additional: usize) {
        let need = lines_for(self.len + additional);
        let have = self.lines.get().len();
        if need > have {
            // Grow at least geometrically, so that many small reservations (one per worker
            // registering) cost a few rehashes, not one each.
            let grown = have + have / 4;
            self.rehash(need.max(grown).max(MIN_LINES));
        }
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the table holds no key.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of slots (for load-factor tests).
    #[cfg(test)]
    fn slots(&self) -> usize {
        self.lines.get().len() * SLOTS
    }

    /// Bytes held (lines only; the struct itself is a few words). A mapped table counts the
    /// huge pages its lines occupy.
    pub fn heap_bytes(&self) -> usize {
        self.lines.bytes()
    }

    /// Starts loading the home line of every key and the line after it (a prefetch hint, see
    /// `super::prefetch`), so that their cache misses overlap (memory-level parallelism); the
    /// caller then looks them up while they are in flight or cached.
    #[inline(always)]
    pub fn prefetch(&self, keys: impl Iterator<Item = u64>) {
        prefetch_lines(self.lines.get(), keys);
    }

    /// The value of `key`, inserting `0` if absent; `true` when inserted. One probe instead
    /// of a `get` then an `insert`. Inlined: it runs twice per stored block, and the common
    /// case is a few instructions once the home line is in cache.
    #[inline(always)]
    pub fn entry(&mut self, key: u64) -> (&mut u32, bool) {
        if key == 0 || self.len >= self.grow_at {
            return self.entry_zero_or_growing(key);
        }
        entry_in_lines(self.lines.get_mut(), &mut self.len, key)
    }

    /// Makes room for `additional` more keys and returns a view that inserts them with
    /// [`Batch::entry`]. The view takes the lines once for the whole batch: each view of a
    /// mapped table checks its layout, which per key cost ~10 % of ingest.
    #[inline(always)]
    pub fn batch(&mut self, additional: usize) -> Batch<'_> {
        if self.len + additional >= self.grow_at {
            self.reserve(additional.max(1));
        }
        Batch {
            lines: self.lines.get_mut(),
            len: &mut self.len,
            zero: &mut self.zero,
        }
    }

    /// [`U64Table::entry`] for key `0` (kept in its side slot) or a table at its maximum
    /// load (grows first).
    #[inline(never)]
    fn entry_zero_or_growing(&mut self, key: u64) -> (&mut u32, bool) {
        if key == 0 {
            return zero_entry(&mut self.zero, &mut self.len);
        }
        let n = self.lines.get().len();
        let grown = (n + n / 4).max(lines_for(self.len + 1)).max(MIN_LINES);
        self.rehash(grown);
        self.entry(key)
    }

    /// The value of `key`.
    #[inline(always)]
    pub fn get(&self, key: u64) -> Option<u32> {
        if key == 0 {
            return self.zero;
        }
        let lines = self.lines.get();
        find(lines, key).map(|(l, s)| lines[l].vals[s])
    }

    /// Inserts or replaces; returns the previous value.
    pub fn insert(&mut self, key: u64, val: u32) -> Option<u32> {
        match self.entry(key) {
            (slot, true) => {
                *slot = val;
                None
            }
            (slot, false) => Some(std::mem::replace(slot, val)),
        }
    }

    /// Removes `key`; returns its value.
    pub fn remove(&mut self, key: u64) -> Option<u32> {
        if key == 0 {
            let old = self.zero.take();
            if old.is_some() {
                self.len -= 1;
            }
            return old;
        }
        let lines = self.lines.get_mut();
        let (l, s) = find(lines, key)?;
        let val = lines[l].vals[s];
        lines[l].keys[s] = 0;
        let n = lines.len();
        let mut x = home(key, n);
        while x != l {
            lines[x].overflow -= 1;
            x = next(x, n);
        }
        self.len -= 1;
        if self.len == 0 {
            // Release memory of tables that emptied (a cleared worker).
            self.lines = Lines::Heap(Vec::new());
            self.grow_at = 0;
        }
        Some(val)
    }

    /// Removes `key` if its value is `val`; returns whether it did. One probe.
    pub fn remove_if(&mut self, key: u64, val: u32) -> bool {
        if key == 0 {
            if self.zero != Some(val) {
                return false;
            }
            self.zero = None;
            self.len -= 1;
            return true;
        }
        let lines = self.lines.get_mut();
        let Some((l, s)) = find(lines, key) else {
            return false;
        };
        if lines[l].vals[s] != val {
            return false;
        }
        lines[l].keys[s] = 0;
        let n = lines.len();
        let mut x = home(key, n);
        while x != l {
            lines[x].overflow -= 1;
            x = next(x, n);
        }
        self.len -= 1;
        if self.len == 0 {
            self.lines = Lines::Heap(Vec::new());
            self.grow_at = 0;
        }
        true
    }

    /// Removes each `(key, value)` of `entries` whose key still has that value, in one pass
    /// that starts loading each key's lines (a prefetch, as [`U64Table::prefetch`]) `AHEAD`
    /// entries before its removal, so that the misses overlap; returns how many it removed. One view of the
    /// lines for the whole batch: [`U64Table::remove_if`] per entry, with a prefetch call
    /// per entry, took two views (each checks a mapping's layout) per removal.
    pub fn remove_all_if(&mut self, entries: &[(u64, u32)]) -> usize {
        const AHEAD: usize = 32;
        let mut removed = 0;
        let lines = self.lines.get_mut();
        let n = lines.len();
        if n > 0 {
            prefetch_lines(lines, entries.iter().take(AHEAD).map(|&(key, _)| key));
        }
        for (i, &(key, val)) in entries.iter().enumerate() {
            match entries.get(i + AHEAD) {
                Some(&(ahead, _)) if n > 0 => prefetch_lines(lines, std::iter::once(ahead)),
                _ => {}
            }
            if key == 0 {
                if self.zero == Some(val) {
                    self.zero = None;
                    removed += 1;
                }
                continue;
            }
            let Some((l, s)) = find(lines, key) else {
                continue;
            };
            if lines[l].vals[s] != val {
                continue;
            }
            lines[l].keys[s] = 0;
            let mut x = home(key, n);
            while x != l {
                lines[x].overflow -= 1;
                x = next(x, n);
            }
            removed += 1;
        }
        self.len -= removed;
        if self.len == 0 {
            self.lines = Lines::Heap(Vec::new());
            self.grow_at = 0;
        }
        removed
    }

    /// Keys that fit before the table grows.
    pub fn spare(&self) -> usize {
        self.grow_at.saturating_sub(self.len)
    }

    /// Keeps the entries for which `keep` returns `true` (it may rewrite the value), removes
    /// the others, in one pass over the lines (no probe per removed key: its overflow counts
    /// are on the lines just before its own).
    pub fn retain(&mut self, mut keep: impl FnMut(&mut u32) -> bool) {
        if let Some(v) = self.zero.as_mut() {
            if !keep(v) {
                self.zero = None;
                self.len -= 1;
            }
        }
        let lines = self.lines.get_mut();
        let n = lines.len();
        for l in 0..n {
            for s in 0..SLOTS {
                let key = lines[l].keys[s];
                if key == 0 || keep(&mut lines[l].vals[s]) {
                    continue;
                }
                lines[l].keys[s] = 0;
                let mut x = home(key, n);
                while x != l {
                    lines[x].overflow -= 1;
                    x = next(x, n);
                }
                self.len -= 1;
            }
        }
        if self.len == 0 {
            self.lines = Lines::Heap(Vec::new());
            self.grow_at = 0;
        }
    }

    /// Rewrites every value in place (keys, and so positions, stay).
    pub fn for_each_value_mut(&mut self, mut f: impl FnMut(&mut u32)) {
        if let Some(v) = self.zero.as_mut() {
            f(v);
        }
        for line in self.lines.get_mut() {
            for (k, v) in line.keys.iter().zip(&mut line.vals) {
                if *k != 0 {
                    f(v);
                }
            }
        }
    }

    /// Calls `f` with every value, in table order.
    #[inline]
    pub fn for_each_value(&self, mut f: impl FnMut(u32)) {
        if let Some(v) = self.zero {
            f(v);
        }
        for line in self.lines.get() {
            for s in 0..SLOTS {
                if line.keys[s] != 0 {
                    f(line.vals[s]);
                }
            }
        }
    }

    /// Every (key, value).
    pub fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.zero.map(|v| (0, v)).into_iter().chain(
            self.lines
                .get()
                .iter()
                .flat_map(|line| line.keys.iter().zip(&line.vals))
                .filter(|(k, _)| **k != 0)
                .map(|(k, v)| (*k, *v)),
        )
    }

    fn rehash(&mut self, n: usize) {
        let old = std::mem::replace(&mut self.lines, Lines::new(n));
        self.grow_at = n * SLOTS * MAX_LOAD_NUM / MAX_LOAD_DEN;
        self.len = usize::from(self.zero.is_some());
        let lines = self.lines.get_mut();
        for line in old.get() {
            for (&k, &v) in line.keys.iter().zip(&line.vals) {
                if k != 0 {
                    place(lines, k, v);
                    self.len += 1;
                }
            }
        }
    }
}

/// Inserts into a [`U64Table`] with room reserved for them (see [`U64Table::batch`]).
pub struct Batch<'a> {
    lines: &'a mut [Line],
    len: &'a mut usize,
    zero: &'a mut Option<u32>,
}

impl Batch<'_> {
    /// As [`U64Table::entry`], for at most the number of new keys the batch was made for.
    #[inline(always)]
    pub fn entry(&mut self, key: u64) -> (&mut u32, bool) {
        if key == 0 {
            return zero_entry(self.zero, self.len);
        }
        entry_in_lines(self.lines, self.len, key)
    }

    /// As [`U64Table::prefetch`].
    #[inline(always)]
    pub fn prefetch(&self, keys: impl Iterator<Item = u64>) {
        prefetch_lines(self.lines, keys);
    }
}

/// The entry of key `0`, which lives in its side slot; `true` when inserted.
fn zero_entry<'a>(zero: &'a mut Option<u32>, len: &mut usize) -> (&'a mut u32, bool) {
    let inserted = zero.is_none();
    if inserted {
        *len += 1;
    }
    (zero.get_or_insert(0), inserted)
}

/// Starts loading the home line of every key and the line after it (see
/// [`U64Table::prefetch`]). The next line too because at 64-80 % load about a third of the
/// home lines are full or overflowed, so an insert, removal or lookup often goes on to the
/// next line; in the KV index's steady state (engine ids arriving four to a home line into
/// tables ~70 % full) most new groups of four spill over. Measured with the index-vs-Dynamo
/// workload (Switchyard alone, three alternating runs each): churn ~13.6 -> ~14.8 M
/// blocks/s, ingest ~21.9 -> ~23.2 M blocks/s (`docs/kv-index-vs-dynamo.md`).
#[inline(always)]
fn prefetch_lines(lines: &[Line], keys: impl Iterator<Item = u64>) {
    let n = lines.len();
    if n == 0 {
        return;
    }
    for k in keys {
        let h = home(k, n);
        prefetch(&lines[h]);
        prefetch(&lines[next(h, n)]);
    }
}

/// The insert or lookup of a nonzero `key` in a table with room for it.
#[inline(always)]
fn entry_in_lines<'a>(lines: &'a mut [Line], len: &mut usize, key: u64) -> (&'a mut u32, bool) {
    // Common case in one pass over the home line: the key is there, or it is not and
    // nothing overflowed from it, so it goes into the line's first free slot.
    let l = home(key, lines.len());
    let line = &mut lines[l];
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
        return (&mut lines[l].vals[hit], false);
    }
    if free < SLOTS && line.overflow == 0 {
        line.keys[free] = key;
        line.vals[free] = 0;
        *len += 1;
        return (&mut lines[l].vals[free], true);
    }
    entry_past_home(lines, len, key)
}

/// [`U64Table::entry`] when the home line has overflowed (or is full): kept out of line so
/// the common path stays small.
#[inline(never)]
fn entry_past_home<'a>(lines: &'a mut [Line], len: &mut usize, key: u64) -> (&'a mut u32, bool) {
    let (l, s, inserted) = match find(lines, key) {
        Some((l, s)) => (l, s, false),
        None => {
            *len += 1;
            let (l, s) = place(lines, key, 0);
            (l, s, true)
        }
    };
    (&mut lines[l].vals[s], inserted)
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
            let mut t: U64Table = U64Table::new();
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

    proptest::proptest! {
        /// `retain` removes exactly the rejected keys, keeps the overflow counts right (later
        /// lookups and removals still work) and applies value rewrites.
        #[test]
        fn retain_behaves_like_hash_map_retain(
            keys in proptest::collection::vec(0u64..500, 0..800),
            modulus in 1u32..5,
        ) {
            let mut t: U64Table = U64Table::with_capacity(200);
            let mut m: HashMap<u64, u32> = HashMap::new();
            for (i, k) in keys.iter().enumerate() {
                let key = k.wrapping_mul(0x2545_f491_4f6c_dd1d) >> (k % 3);
                t.insert(key, i as u32);
                m.insert(key, i as u32);
            }
            t.retain(|v| {
                *v += 1;
                *v % modulus != 0
            });
            m.retain(|_, v| (*v + 1) % modulus != 0);
            proptest::prop_assert_eq!(t.len(), m.len());
            for (k, v) in &m {
                proptest::prop_assert_eq!(t.get(*k), Some(v + 1));
            }
            for k in m.keys() {
                proptest::prop_assert!(t.remove(*k).is_some());
            }
            proptest::prop_assert_eq!(t.len(), 0);
        }
    }

    proptest::proptest! {
        /// `remove_all_if` removes exactly the entries whose key still has the given value,
        /// including key 0 and keys named twice, and keeps the overflow counts right.
        #[test]
        fn remove_all_if_behaves_like_conditional_removes(
            keys in proptest::collection::vec((0u64..300, 0u32..3), 0..600),
            batch in proptest::collection::vec((0u64..300, 0u32..3), 0..200),
        ) {
            let spread = |k: u64| if k < 3 { k } else { k.wrapping_mul(0x2545_f491_4f6c_dd1d) >> (k % 3) };
            let mut t: U64Table = U64Table::with_capacity(100);
            let mut m: HashMap<u64, u32> = HashMap::new();
            for (k, v) in keys {
                t.insert(spread(k), v);
                m.insert(spread(k), v);
            }
            let batch: Vec<(u64, u32)> = batch.into_iter().map(|(k, v)| (spread(k), v)).collect();
            let mut expected = 0;
            for &(k, v) in &batch {
                if m.get(&k) == Some(&v) {
                    m.remove(&k);
                    expected += 1;
                }
            }
            proptest::prop_assert_eq!(t.remove_all_if(&batch), expected);
            proptest::prop_assert_eq!(t.len(), m.len());
            for (k, v) in &m {
                proptest::prop_assert_eq!(t.get(*k), Some(*v));
            }
            for k in m.keys() {
                proptest::prop_assert!(t.remove(*k).is_some());
            }
            proptest::prop_assert_eq!(t.len(), 0);
        }
    }

    #[test]
    fn stays_between_64_and_80_percent_full_while_growing() {
        let mut t: U64Table = U64Table::new();
        for k in 1..200_000u64 {
            t.insert(k, 1);
            if k > 1_000 {
                let load = t.len() as f64 / t.slots() as f64;
                assert!((0.63..=0.8).contains(&load), "load {load} at {k}");
            }
        }
    }

    /// A table big enough to be mapped (see the module docs) behaves like a small one,
    /// including through growth from a `Vec` into a mapping, overflowed lines, removals, and
    /// emptying (which drops the mapping).
    #[test]
    fn a_mapped_table_behaves_like_a_hash_map() {
        let keys = MAP_MIN_BYTES / LINE_BYTES * SLOTS;
        let mut t: U64Table = U64Table::with_capacity(keys / 2);
        assert!(!t.lines.is_mapped());
        let mut m: HashMap<u64, u32> = HashMap::new();
        let key = |i: u64| i.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1;
        for i in 0..keys as u64 {
            assert_eq!(t.insert(key(i), i as u32), m.insert(key(i), i as u32));
        }
        assert!(t.lines.is_mapped());
        assert!(t.heap_bytes() >= t.slots() / SLOTS * LINE_BYTES);
        assert_eq!(t.heap_bytes() % HUGE_PAGE, 0);
        assert!(t.lines.get().iter().any(|l| l.overflow > 0));
        for i in (0..keys as u64).step_by(3) {
            assert_eq!(t.remove(key(i)), m.remove(&key(i)));
        }
        t.for_each_value_mut(|v| *v += 1);
        assert_eq!(t.len(), m.len());
        for (k, v) in &m {
            assert_eq!(t.get(*k), Some(v + 1));
        }
        assert_eq!(t.get(key(0)), None);
        for k in m.keys() {
            assert!(t.remove(*k).is_some());
        }
        assert_eq!(t.len(), 0);
        assert!(!t.lines.is_mapped());
    }

    #[test]
    fn a_line_is_one_cache_line() {
        assert_eq!(std::mem::size_of::<Line>(), 64);
        assert_eq!(std::mem::align_of::<Line>(), 64);
    }

    proptest::proptest! {
        /// Many keys near the maximum load, so lines overflow and removals must keep the
        /// overflow counts right.
        #[test]
        fn behaves_like_a_hash_map_when_crowded(
            ops in proptest::collection::vec((0u8..4, 0u64..400), 0..3000)
        ) {
            let mut t: U64Table = U64Table::with_capacity(300);
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
            let lines = t.lines.get();
            let overflow: u32 = lines.iter().map(|l| l.overflow).sum();
            let displaced: usize = t.iter().filter(|(k, _)| *k != 0).map(|(k, _)| {
                let (l, _) = find(lines, k).unwrap();
                let h = home(k, lines.len());
                if l >= h { l - h } else { l + lines.len() - h }
            }).sum();
            proptest::prop_assert_eq!(overflow as usize, displaced);
        }
    }
}
