//! Which workers hold one block: a compact set of worker slots.
//!
//! Most blocks live on one or two workers (KV-aware routing keeps a conversation on one
//! worker; shared system prompts are the exception), so a set is a `u32` in the index's hash
//! table: up to two 15-bit slots inline, or, for three or more workers, the index of a bitset
//! in a [`SetArena`] (one flat `Vec<u64>` with a fixed number of words per set, so a set of
//! 128 workers costs 16 bytes and intersecting it is two `AND`s).

/// Largest worker slot (15 bits; `0x7FFF` marks an empty inline field). Bit 30 of a packed
/// set is never used by the set: the record keeps its head bit there (`records`).
pub const MAX_SLOT: u16 = 0x7FFE;
const EMPTY: u32 = 0x7FFF;
const ARENA_TAG: u32 = 1 << 31;

/// A set of worker slots as stored in the table (see module docs).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    zerocopy::FromBytes,
    zerocopy::IntoBytes,
    zerocopy::KnownLayout,
    zerocopy::Immutable,
)]
#[repr(transparent)]
pub(crate) struct PackedSet(pub(crate) u32);

/// Decoded view of a [`PackedSet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SetView {
    /// One or two slots (the second is `None` for one).
    Inline(u16, Option<u16>),
    /// Bitset number `n` in the arena.
    Arena(u32),
}

impl PackedSet {
    pub(crate) fn one(slot: u16) -> Self {
        PackedSet(u32::from(slot) | (EMPTY << 15))
    }

    fn two(a: u16, b: u16) -> Self {
        PackedSet(u32::from(a) | (u32::from(b) << 15))
    }

    #[inline]
    pub(crate) fn view(self) -> SetView {
        if self.0 & ARENA_TAG != 0 {
            return SetView::Arena(self.0 & !ARENA_TAG);
        }
        let a = (self.0 & EMPTY) as u16;
        let b = (self.0 >> 15) & EMPTY;
        SetView::Inline(a, (b != EMPTY).then_some(b as u16))
    }
}

/// Bitsets of three or more workers, `words` `u64`s each, with a free list.
#[derive(Debug, Default)]
pub(crate) struct SetArena {
    bits: Vec<u64>,
    words: usize,
    free: Vec<u32>,
}

impl SetArena {
    /// The bitset of arena set `n`.
    #[inline]
    pub(crate) fn get(&self, n: u32) -> &[u64] {
        let at = n as usize * self.words;
        &self.bits[at..at + self.words]
    }

    /// Number of sets in use.
    #[cfg(test)]
    pub(crate) fn live_sets(&self) -> usize {
        self.bits.len().checked_div(self.words).unwrap_or(0) - self.free.len()
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.bits.capacity() * 8 + self.free.capacity() * 4
    }

    /// Makes room for slot `slot` in every set (re-strides the arena; happens only when the
    /// highest worker slot crosses a multiple of 64).
    pub(crate) fn ensure_slot(&mut self, slot: u16) {
        let need = usize::from(slot) / 64 + 1;
        if need <= self.words {
            return;
        }
        let sets = self.bits.len().checked_div(self.words).unwrap_or(0);
        let mut bits = vec![0u64; sets * need];
        for s in 0..sets {
            bits[s * need..s * need + self.words]
                .copy_from_slice(&self.bits[s * self.words..(s + 1) * self.words]);
        }
        self.bits = bits;
        self.words = need;
    }

    fn alloc(&mut self, slots: &[u16]) -> u32 {
        let n = match self.free.pop() {
            Some(n) => n,
            None => {
                let n = (self.bits.len() / self.words) as u32;
                // Bit 30 of a packed set is the record's head bit (`records`): 2^30 sets of
                // three or more workers is far beyond any index's blocks.
                debug_assert!(n < 1 << 30, "arena set index overflows 30 bits");
                self.bits.resize(self.bits.len() + self.words, 0);
                n
            }
        };
        let at = n as usize * self.words;
        for &s in slots {
            self.bits[at + usize::from(s) / 64] |= 1 << (s % 64);
        }
        n
    }

    fn release(&mut self, n: u32) {
        let at = n as usize * self.words;
        self.bits[at..at + self.words].fill(0);
        self.free.push(n);
    }

    /// Adds `slot` to `set`; returns the new set and whether the slot was already there.
    /// The caller has called [`SetArena::ensure_slot`] for `slot`.
    #[inline]
    pub(crate) fn insert(&mut self, set: PackedSet, slot: u16) -> (PackedSet, bool) {
        match set.view() {
            SetView::Inline(a, None) if a == slot => (set, true),
            SetView::Inline(a, None) => (PackedSet::two(a, slot), false),
            SetView::Inline(a, Some(b)) if a == slot || b == slot => (set, true),
            SetView::Inline(a, Some(b)) => {
                let n = self.alloc(&[a, b, slot]);
                (PackedSet(ARENA_TAG | n), false)
            }
            SetView::Arena(n) => {
                let at = n as usize * self.words + usize::from(slot) / 64;
                let bit = 1u64 << (slot % 64);
                let had = self.bits[at] & bit != 0;
                self.bits[at] |= bit;
                (set, had)
            }
        }
    }

    /// Removes `slot` from `set`; returns the new set (`None` when it emptied) and whether the
    /// slot was there.
    #[inline]
    pub(crate) fn remove(&mut self, set: PackedSet, slot: u16) -> (Option<PackedSet>, bool) {
        match set.view() {
            SetView::Inline(a, None) if a == slot => (None, true),
            SetView::Inline(a, Some(b)) if a == slot => (Some(PackedSet::one(b)), true),
            SetView::Inline(a, Some(b)) if b == slot => (Some(PackedSet::one(a)), true),
            SetView::Inline(..) => (Some(set), false),
            SetView::Arena(n) => {
                let at = n as usize * self.words;
                let word = at + usize::from(slot) / 64;
                let bit = 1u64 << (slot % 64);
                if self.bits[word] & bit == 0 {
                    return (Some(set), false);
                }
                self.bits[word] &= !bit;
                let words = &self.bits[at..at + self.words];
                let count: u32 = words.iter().map(|w| w.count_ones()).sum();
                if count > 2 {
                    return (Some(set), true);
                }
                // Back to inline: two slots left.
                let (a, b) = {
                    let mut left = slots_of(words);
                    (left.next().unwrap_or(0), left.next().unwrap_or(0))
                };
                self.release(n);
                (Some(PackedSet::two(a, b)), true)
            }
        }
    }

    /// Number of slots in `set`.
    #[cfg(test)]
    pub(crate) fn count(&self, set: PackedSet) -> usize {
        match set.view() {
            SetView::Inline(_, None) => 1,
            SetView::Inline(_, Some(_)) => 2,
            SetView::Arena(n) => self.get(n).iter().map(|w| w.count_ones() as usize).sum(),
        }
    }
}

/// Slots whose bits are set in `words`, ascending.
pub(crate) fn slots_of(words: &[u64]) -> impl Iterator<Item = u16> + '_ {
    words.iter().enumerate().flat_map(|(i, &w)| {
        let mut w = w;
        std::iter::from_fn(move || {
            if w == 0 {
                return None;
            }
            let bit = w.trailing_zeros();
            w &= w - 1;
            Some((i * 64) as u16 + bit as u16)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    proptest::proptest! {
        #[test]
        fn behaves_like_a_set(ops in proptest::collection::vec((proptest::bool::ANY, 0u16..200), 1..200)) {
            let mut arena = SetArena::default();
            arena.ensure_slot(199);
            let mut set: Option<PackedSet> = None;
            let mut model = BTreeSet::new();
            for (add, slot) in ops {
                if add {
                    let (s, had) = match set {
                        None => (PackedSet::one(slot), false),
                        Some(s) => arena.insert(s, slot),
                    };
                    proptest::prop_assert_eq!(had, !model.insert(slot));
                    set = Some(s);
                } else if let Some(s) = set {
                    let (s, had) = arena.remove(s, slot);
                    proptest::prop_assert_eq!(had, model.remove(&slot));
                    set = s;
                }
                proptest::prop_assert_eq!(set.map_or(0, |s| arena.count(s)), model.len());
            }
            // Everything demoted or freed: at most one arena set in use.
            proptest::prop_assert!(arena.live_sets() <= 1);
        }
    }

    #[test]
    fn re_striding_keeps_members() {
        let mut arena = SetArena::default();
        arena.ensure_slot(10);
        let (s, _) = arena.insert(PackedSet::one(1), 2);
        let (s, _) = arena.insert(s, 3);
        arena.ensure_slot(300);
        let (s, had) = arena.insert(s, 300);
        assert!(!had);
        let SetView::Arena(n) = s.view() else {
            panic!("three slots live in the arena")
        };
        assert_eq!(
            slots_of(arena.get(n)).collect::<Vec<_>>(),
            vec![1, 2, 3, 300]
        );
    }
}
