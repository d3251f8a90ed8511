//! The prefix query: walk the prompt's hashes, intersecting the set of candidate workers
//! with each block's holders; a worker's match ends where it drops out.
//!
//! Two things keep it fast. Records of a stored chain are contiguous (see
//! [`super::records`]), so the walk first checks whether the record after the current one is
//! the prompt's next block (a sequential read) and only probes the hash table when the prompt
//! leaves the chain: a 512-block prompt against millions of stored blocks is then a few
//! lookups and a scan, not 512 trips to memory. And the candidate set is kept inline while
//! it has at most two workers (the common case past a shared system prompt: a conversation
//! lives on one worker), so a step is two compares; larger sets are bitsets ANDed word by
//! word.

use switchyard_protocol::hash::SequenceHash;

use super::prefetch::prefetch;
use super::records::Record;
use super::worker_set::{slots_of, PackedSet, SetView};
use super::{KvIndex, OverlapScores, WorkerSlot};

/// Records whose cache lines are loaded ahead when a query enters a stored chain: a whole
/// long prompt's chain, while bounding the wasted loads if chains turn out short.
const PREFETCH_AHEAD: usize = 128;

/// The live candidates: inline while there are at most two, else the bitset in
/// `OverlapScores::candidates`.
#[derive(Clone, Copy)]
enum Cand {
    Small([u16; 2], usize),
    Bits,
}

impl KvIndex {
    /// For each worker holding the prompt's first block, the number of leading blocks of
    /// `hashes` it holds, into `out` (cleared first).
    pub fn find_matches(&self, hashes: &[SequenceHash], out: &mut OverlapScores) {
        out.matches.clear();
        let Some(first) = hashes.first() else {
            return;
        };
        // A first block no event stored as a prompt's first: nobody holds it, and the small
        // root table said so without a cold line of the big one. One that is names its record,
        // so a hit skips that line too.
        let first = if self.roots_unknown {
            self.lookup(first.0)
        } else {
            self.root(first.0)
        };
        let Some(mut at) = first else {
            return;
        };
        // One view of the records for the whole walk (each view checks the mapping's layout),
        // taken after the first lookup so that a miss does not pay for it.
        let records: &[Record] = &self.records.all;
        let mut cand = match records[at as usize].holders().view() {
            SetView::Inline(a, None) => Cand::Small([a, 0], 1),
            SetView::Inline(a, Some(b)) => Cand::Small([a, b], 2),
            SetView::Arena(n) => {
                out.candidates.clear();
                out.candidates.extend_from_slice(self.sets.get(n));
                Cand::Bits
            }
        };
        let mut depth = 1u32;
        let mut rest = &hashes[1..];
        while let Some((h, tail)) = rest.split_first() {
            if let Cand::Small([w, _], 1) = cand {
                // One candidate left (a conversation on its worker): follow its chain in a
                // tight loop while the next record is the next block and still held by it.
                let ahead = &records[(at as usize + 1).min(records.len())..];
                let ahead = &ahead[..ahead.len().min(rest.len())];
                if ahead.first().is_some_and(|r| r.hash() == h.0) {
                    // The chain goes on: start loading its next cache lines at once (5 records
                    // per 64-byte line, at most `PREFETCH_AHEAD` records per entry) so that
                    // the compare loop below mostly hits lines already in flight.
                    for r in ahead[..ahead.len().min(PREFETCH_AHEAD)].iter().step_by(5) {
                        prefetch(r);
                    }
                }
                // The common record is held by exactly this worker: compare it whole.
                let only_w = PackedSet::one(w);
                let mut skipped = 0;
                // Eight records at a time without branching per record (the compiler
                // vectorises it), then one by one from the first chunk that differs.
                for (rs, hs) in ahead.chunks_exact(8).zip(rest.chunks_exact(8)) {
                    let same = rs.iter().zip(hs).fold(true, |all, (r, h)| {
                        all & (r.hash() == h.0) & (r.holders() == only_w)
                    });
                    if !same {
                        break;
                    }
                    skipped += 8;
                }
                for (r, h) in ahead[skipped..].iter().zip(&rest[skipped..]) {
                    if r.hash() != h.0 {
                        break;
                    }
                    if r.holders() != only_w && !(r.is_live() && self.holds(r.holders().view(), w))
                    {
                        break;
                    }
                    skipped += 1;
                }
                if skipped > 0 {
                    at += skipped as u32;
                    depth += skipped as u32;
                    rest = &rest[skipped..];
                    continue;
                }
            }
            if let Cand::Bits = cand {
                // Many candidates (a shared system prompt): skip ahead while the chain goes on
                // and nobody drops out (every candidate bit is in the block's holder set).
                let mut skipped = 0;
                for (r, h) in records[at as usize + 1..].iter().zip(rest) {
                    if r.hash() != h.0 || !r.is_live() {
                        break;
                    }
                    let SetView::Arena(n) = r.holders().view() else {
                        break;
                    };
                    let keeps_all = out
                        .candidates
                        .iter()
                        .zip(self.sets.get(n))
                        .all(|(c, s)| c & !s == 0);
                    if !keeps_all {
                        break;
                    }
                    skipped += 1;
                }
                if skipped > 0 {
                    at += skipped as u32;
                    depth += skipped as u32;
                    rest = &rest[skipped..];
                    continue;
                }
            }
            // Still on the stored chain? (A dead record has hash 0 and never holds a set.) If
            // not, the block's record, if any, is a head: the one after its parent's record
            // is not it.
            let next = records
                .get(at as usize + 1)
                .filter(|r| r.hash() == h.0 && r.is_live());
            at = match next {
                Some(_) => at + 1,
                // The table may point at a dead record (see `drop_holder`): not held.
                None => match self.holders.get(h.0) {
                    Some(i) if records[i as usize].is_live() => i,
                    _ => break,
                },
            };
            match self.step(cand, records[at as usize].holders(), depth, out) {
                Some(c) => cand = c,
                // Every candidate dropped out (and was recorded) at this block.
                None => return,
            }
            depth += 1;
            rest = tail;
        }
        // The remaining candidates matched `depth` blocks.
        push_all(cand, depth, out);
    }

    /// The live record of a prompt's first block `hash`, through the root table (which names
    /// the record, so the big table's cold line is not read), `None` if no event stored it as
    /// a prompt's first block. An entry that points at a dead record (the hash died, and was
    /// not stored again as a first block since) falls back on the big table.
    #[inline]
    pub(crate) fn root(&self, hash: u64) -> Option<u32> {
        let rec = self.roots.get(hash)?;
        let r = self.records.all[rec as usize];
        if r.is_live() && r.hash() == hash {
            Some(rec)
        } else {
            self.lookup(hash)
        }
    }

    /// Intersects `cand` with `set`; workers that drop out are recorded with `depth`.
    /// `None` when no candidate is left.
    #[inline]
    fn step(
        &self,
        cand: Cand,
        set: PackedSet,
        depth: u32,
        out: &mut OverlapScores,
    ) -> Option<Cand> {
        let view = set.view();
        match cand {
            Cand::Small(members, len) => {
                let mut kept = [0u16; 2];
                let mut n = 0;
                for &w in &members[..len] {
                    if self.holds(view, w) {
                        kept[n] = w;
                        n += 1;
                    } else {
                        out.matches.push((WorkerSlot(w), depth));
                    }
                }
                (n > 0).then_some(Cand::Small(kept, n))
            }
            Cand::Bits => match view {
                SetView::Inline(a, b) => {
                    let bits = &out.candidates;
                    let mut kept = [0u16; 2];
                    let mut n = 0;
                    for w in std::iter::once(a).chain(b) {
                        if has_bit(bits, w) {
                            kept[n] = w;
                            n += 1;
                        }
                    }
                    for w in slots_of(bits) {
                        if !kept[..n].contains(&w) {
                            out.matches.push((WorkerSlot(w), depth));
                        }
                    }
                    (n > 0).then_some(Cand::Small(kept, n))
                }
                SetView::Arena(i) => {
                    let mut any = 0;
                    for (word, (c, s)) in
                        out.candidates.iter_mut().zip(self.sets.get(i)).enumerate()
                    {
                        let mut dropped = *c & !s;
                        *c &= s;
                        any |= *c;
                        while dropped != 0 {
                            let bit = dropped.trailing_zeros() as u16;
                            dropped &= dropped - 1;
                            out.matches
                                .push((WorkerSlot(word as u16 * 64 + bit), depth));
                        }
                    }
                    (any != 0).then_some(Cand::Bits)
                }
            },
        }
    }

    #[inline]
    fn holds(&self, view: SetView, w: u16) -> bool {
        match view {
            SetView::Inline(a, b) => a == w || b == Some(w),
            SetView::Arena(i) => has_bit(self.sets.get(i), w),
        }
    }
}

fn push_all(cand: Cand, depth: u32, out: &mut OverlapScores) {
    match cand {
        Cand::Small(members, len) => {
            for &w in &members[..len] {
                out.matches.push((WorkerSlot(w), depth));
            }
        }
        Cand::Bits => {
            for w in slots_of(&out.candidates) {
                out.matches.push((WorkerSlot(w), depth));
            }
        }
    }
}

#[inline]
fn has_bit(words: &[u64], slot: u16) -> bool {
    words
        .get(usize::from(slot) / 64)
        .is_some_and(|w| w & (1 << (slot % 64)) != 0)
}
