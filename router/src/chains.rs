//! Prompts as hash chains, and the longest prefix a set of them shares with a new one.
//!
//! A prompt's blocks are sequence hashes, each chained over the one before
//! ([`switchyard_protocol::hash`]): equal hashes at position `i` of two prompts mean equal
//! prompts up to block `i` (collisions aside, about 2^-64 per pair). So the blocks that a set
//! of prompts holds form a prefix tree, and what a new prompt shares with the set is one
//! number: the longest common prefix with any member. Two prompts' common prefix is found by
//! binary search, since "position `i` is equal" holds up to the first difference and never
//! after it.
//!
//! That turns the per-block work of the load tracker and the KV predictions (a hash-table
//! update per block of every routed prompt: 8,000 of them at 128k tokens) into a few probes
//! per prompt in flight.

use std::sync::Arc;

use switchyard_protocol::hash::SequenceHash;

/// A prompt's full blocks, shared by every record of it (legs, predictions, peers).
pub type Chain = Arc<[SequenceHash]>;

/// Length of the common prefix of `a` and `b`, given that it is at least `known` (callers
/// pass a bound they have already checked, or 0).
pub fn common_prefix(a: &[SequenceHash], b: &[SequenceHash], known: usize) -> usize {
    let end = a.len().min(b.len());
    // Invariant: positions < lo are equal; position hi (if < end) differs.
    let (mut lo, mut hi) = (known.min(end), end);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if a[mid] == b[mid] {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// The longest prefix of `hashes` that any of `chains` shares, and at least `floor`.
///
/// Each chain costs one probe unless it beats the best so far: a chain that does not match
/// `hashes` at the current best length cannot share more.
pub fn longest_shared_prefix<'a>(
    chains: impl IntoIterator<Item = &'a [SequenceHash]>,
    hashes: &[SequenceHash],
    floor: usize,
) -> usize {
    let mut best = floor.min(hashes.len());
    for chain in chains {
        if best == hashes.len() {
            break;
        }
        // Sharing more than `best` needs position `best` equal, and a chain equal there is
        // equal at every position before it (chaining), so the search goes on from there.
        if chain.get(best) == hashes.get(best) {
            best = common_prefix(chain, hashes, best + 1);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// A chain like the hashes of a prompt: position `i`'s value depends on every token up
    /// to it, so two chains agree on a prefix and differ everywhere after.
    fn chain(tokens: &[u8]) -> Vec<SequenceHash> {
        let mut h = 0xcbf2_9ce4_8422_2325_u64;
        tokens
            .iter()
            .map(|&t| {
                h = (h ^ u64::from(t))
                    .wrapping_mul(0x0100_0000_01b3)
                    .rotate_left(17);
                SequenceHash(h)
            })
            .collect()
    }

    fn linear_common_prefix(a: &[SequenceHash], b: &[SequenceHash]) -> usize {
        a.iter().zip(b).take_while(|(x, y)| x == y).count()
    }

    #[test]
    fn common_prefix_of_chains() {
        let a = chain(&[1, 2, 3, 4, 5]);
        assert_eq!(common_prefix(&a, &chain(&[1, 2, 3, 9]), 0), 3);
        assert_eq!(common_prefix(&a, &chain(&[1, 2]), 0), 2);
        assert_eq!(common_prefix(&a, &a, 0), 5);
        assert_eq!(common_prefix(&a, &chain(&[7]), 0), 0);
        assert_eq!(common_prefix(&a, &[], 0), 0);
    }

    proptest! {
        /// Chains drawn from a small alphabet share prefixes of every length.
        #[test]
        fn the_longest_shared_prefix_is_what_a_block_by_block_walk_finds(
            set in prop::collection::vec(prop::collection::vec(0u8..3, 0..40), 0..12),
            query in prop::collection::vec(0u8..3, 0..40),
            floor in 0usize..45,
        ) {
            let chains: Vec<Vec<SequenceHash>> = set.iter().map(|t| chain(t)).collect();
            let q = chain(&query);
            let walked = chains
                .iter()
                .map(|c| linear_common_prefix(c, &q))
                .max()
                .unwrap_or(0)
                .max(floor.min(q.len()));
            let found = longest_shared_prefix(chains.iter().map(Vec::as_slice), &q, floor);
            prop_assert_eq!(found, walked);
        }
    }
}
