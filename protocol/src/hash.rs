//! Token ids -> KV block hashes.
//!
//! The scheme matches NVIDIA Dynamo's KV router so that indexes and events are comparable:
//! the prompt's token ids are cut into full blocks of `block_size` tokens (the partial tail is
//! dropped, since a KV cache only shares full blocks); each block's *local* hash is XXH3-64
//! (seed 1337) over its token ids as little-endian `u32`; the *sequence* hash chains them,
//! `seq[0] = local[0]`, `seq[i] = XXH3-64(seq[i-1] LE u64 ‖ local[i] LE u64, seed 1337)`, so a
//! sequence hash names a block *and everything before it*: equal sequence hashes mean an equal
//! prefix, which is what a prefix cache can reuse.

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Seed of every hash in the scheme. A LoRA adapter or a cache salt would derive another seed
/// (see [`HashSeed`]), so that identical tokens under different adapters never match.
pub const DEFAULT_HASH_SEED: u64 = 1337;

/// Hash of one block's token ids, independent of what precedes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LocalBlockHash(pub u64);

/// Hash of a block together with its whole prefix: the key of the KV index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SequenceHash(pub u64);

/// The seed used for a request's hashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct HashSeed(pub u64);

impl Default for HashSeed {
    fn default() -> Self {
        HashSeed(DEFAULT_HASH_SEED)
    }
}

/// A validated KV block size in tokens (vLLM's default is 16, our simulated workers use 64).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "u32", into = "u32")]
pub struct BlockSize(u32);

/// Errors from building hashing inputs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HashError {
    /// A block size of zero (or above [`BlockSize::MAX`]) cannot cut a prompt into blocks.
    #[error("block size must be between 1 and {max} tokens, got {got}")]
    InvalidBlockSize {
        /// What was given.
        got: u32,
        /// The largest accepted block size.
        max: u32,
    },
}

impl BlockSize {
    /// Largest accepted block size; real engines use 16-256.
    pub const MAX: u32 = 1 << 16;

    /// Validates a block size.
    ///
    /// # Errors
    /// [`HashError::InvalidBlockSize`] for 0 or anything above [`BlockSize::MAX`].
    pub fn try_new(tokens: u32) -> Result<Self, HashError> {
        if tokens == 0 || tokens > Self::MAX {
            return Err(HashError::InvalidBlockSize {
                got: tokens,
                max: Self::MAX,
            });
        }
        Ok(BlockSize(tokens))
    }

    /// The size in tokens.
    pub fn get(self) -> u32 {
        self.0
    }

    /// Number of *full* blocks in `tokens` tokens.
    pub fn full_blocks(self, tokens: usize) -> usize {
        tokens / self.0 as usize
    }
}

impl TryFrom<u32> for BlockSize {
    type Error = HashError;
    fn try_from(value: u32) -> Result<Self, Self::Error> {
        BlockSize::try_new(value)
    }
}

impl From<BlockSize> for u32 {
    fn from(value: BlockSize) -> Self {
        value.0
    }
}

/// Local hash of one block of token ids: xxh3 of the ids' little-endian bytes.
pub fn local_block_hash(tokens: &[u32], seed: HashSeed) -> LocalBlockHash {
    LocalBlockHash(xxh3_64_with_seed(&le_bytes(tokens), seed.0))
}

/// The ids' little-endian bytes, so that every platform hashes the same bytes. On
/// little-endian targets (x86-64, aarch64, wasm32) that is the slice's own memory, borrowed:
/// hashing a prompt is on every route call, and a copy per block doubled its cost.
#[cfg(target_endian = "little")]
fn le_bytes(tokens: &[u32]) -> std::borrow::Cow<'_, [u8]> {
    std::borrow::Cow::Borrowed(zerocopy::IntoBytes::as_bytes(tokens))
}

#[cfg(not(target_endian = "little"))]
fn le_bytes(tokens: &[u32]) -> std::borrow::Cow<'_, [u8]> {
    std::borrow::Cow::Owned(tokens.iter().flat_map(|t| t.to_le_bytes()).collect())
}

/// Sequence hash of a block given its parent's sequence hash (`None` for the first block).
pub fn chain_hash(
    parent: Option<SequenceHash>,
    local: LocalBlockHash,
    seed: HashSeed,
) -> SequenceHash {
    match parent {
        None => SequenceHash(local.0),
        Some(parent) => {
            let mut bytes = [0u8; 16];
            bytes[..8].copy_from_slice(&parent.0.to_le_bytes());
            bytes[8..].copy_from_slice(&local.0.to_le_bytes());
            SequenceHash(xxh3_64_with_seed(&bytes, seed.0))
        }
    }
}

/// Local hashes of every full block of `tokens`.
pub fn local_block_hashes(
    tokens: &[u32],
    block_size: BlockSize,
    seed: HashSeed,
) -> Vec<LocalBlockHash> {
    tokens
        .chunks_exact(block_size.get() as usize)
        .map(|block| local_block_hash(block, seed))
        .collect()
}

/// Sequence hashes from local hashes, continuing after `parent` (`None` at the prompt start).
pub fn sequence_hashes_from(
    parent: Option<SequenceHash>,
    locals: &[LocalBlockHash],
    seed: HashSeed,
) -> Vec<SequenceHash> {
    let mut out = Vec::with_capacity(locals.len());
    let mut prev = parent;
    for &local in locals {
        let seq = chain_hash(prev, local, seed);
        out.push(seq);
        prev = Some(seq);
    }
    out
}

/// Sequence hashes of every full block of `tokens`: what the KV index is queried with.
pub fn sequence_hashes(tokens: &[u32], block_size: BlockSize, seed: HashSeed) -> Vec<SequenceHash> {
    sequence_hashes_from(None, &local_block_hashes(tokens, block_size, seed), seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vector_tokens() -> Vec<u32> {
        (0..64u32).map(|i| 7 * i + 3).collect()
    }

    #[test]
    fn matches_dynamo_local_hash_vector() {
        let bs = BlockSize::try_new(16).unwrap();
        let locals: Vec<u64> = local_block_hashes(&vector_tokens(), bs, HashSeed::default())
            .into_iter()
            .map(|h| h.0)
            .collect();
        assert_eq!(
            locals,
            vec![
                15611300789162007147,
                3359221307614001343,
                17948504698959201258,
                7219753755498179359
            ]
        );
    }

    #[test]
    fn matches_dynamo_sequence_hash_vector() {
        let bs = BlockSize::try_new(16).unwrap();
        let seqs: Vec<u64> = sequence_hashes(&vector_tokens(), bs, HashSeed::default())
            .into_iter()
            .map(|h| h.0)
            .collect();
        assert_eq!(
            seqs,
            vec![
                15611300789162007147,
                2993060222284537841,
                4950482559430061084,
                9221866126237316170
            ]
        );
    }

    #[test]
    fn partial_tail_is_dropped() {
        let bs = BlockSize::try_new(16).unwrap();
        let mut tokens = vector_tokens();
        tokens.extend([1, 2, 3]);
        assert_eq!(sequence_hashes(&tokens, bs, HashSeed::default()).len(), 4);
        assert!(sequence_hashes(&tokens[..15], bs, HashSeed::default()).is_empty());
    }

    #[test]
    fn zero_block_size_is_rejected() {
        assert!(matches!(
            BlockSize::try_new(0),
            Err(HashError::InvalidBlockSize { got: 0, .. })
        ));
        let parsed: Result<BlockSize, _> = serde_json::from_str("0");
        assert!(parsed.is_err());
    }

    #[test]
    fn seed_changes_every_hash() {
        let bs = BlockSize::try_new(16).unwrap();
        let a = sequence_hashes(&vector_tokens(), bs, HashSeed::default());
        let b = sequence_hashes(&vector_tokens(), bs, HashSeed(42));
        assert!(a.iter().zip(&b).all(|(x, y)| x != y));
    }

    #[test]
    fn continuing_a_chain_equals_hashing_the_whole() {
        let bs = BlockSize::try_new(16).unwrap();
        let seed = HashSeed::default();
        let tokens = vector_tokens();
        let whole = sequence_hashes(&tokens, bs, seed);
        let head = sequence_hashes(&tokens[..32], bs, seed);
        let tail_locals = local_block_hashes(&tokens[32..], bs, seed);
        let tail = sequence_hashes_from(head.last().copied(), &tail_locals, seed);
        assert_eq!([head, tail].concat(), whole);
    }

    proptest::proptest! {
        #[test]
        fn equal_prefixes_give_equal_sequence_hashes(
            prefix in proptest::collection::vec(0u32..200_000, 0..200),
            a in proptest::collection::vec(0u32..200_000, 0..100),
            b in proptest::collection::vec(0u32..200_000, 0..100),
        ) {
            let bs = BlockSize::try_new(16).unwrap();
            let seed = HashSeed::default();
            let ha = sequence_hashes(&[prefix.clone(), a].concat(), bs, seed);
            let hb = sequence_hashes(&[prefix.clone(), b].concat(), bs, seed);
            let shared = prefix.len() / 16;
            proptest::prop_assert_eq!(&ha[..shared], &hb[..shared]);
        }
    }
}
