//! Block hashes for trace rows that name prompts by coarse hash ids instead of tokens.

use switchyard_protocol::hash::{chain_hash, HashSeed, LocalBlockHash, SequenceHash};

/// Sequence hashes for a trace row that names its prompt by coarse block ids (Mooncake:
/// 512-token blocks, equal id = equal content) instead of tokens: each trace block is split
/// into `trace_block / block_size` engine blocks whose local hashes derive from the trace id
/// and position, chained as the protocol chains real hashes. Two rows sharing a prefix of
/// trace ids share exactly the corresponding engine blocks, so prefix reuse replays
/// faithfully without any token ids.
///
/// Returns one hash per full engine block of `input_len` tokens (engine blocks past the
/// last trace id, if the row lists too few, get position-only hashes unique to the row's
/// last id). `trace_block` must be a multiple of `block_size`.
pub fn trace_block_hashes(
    hash_ids: &[u64],
    input_len: u32,
    trace_block: u32,
    block_size: u32,
    seed: HashSeed,
) -> Vec<SequenceHash> {
    let per_trace_block = (trace_block / block_size.max(1)).max(1) as usize;
    let full = (input_len / block_size.max(1)) as usize;
    let mut out = Vec::with_capacity(full);
    let mut parent = None;
    for i in 0..full {
        let trace_idx = i / per_trace_block;
        let id = hash_ids
            .get(trace_idx)
            .or(hash_ids.last())
            .copied()
            .unwrap_or(0);
        let mut z = id
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .wrapping_add((i % per_trace_block) as u64 + ((trace_idx as u64) << 32));
        z = (z ^ (z >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let seq = chain_hash(parent, LocalBlockHash(z ^ (z >> 32)), seed);
        out.push(seq);
        parent = Some(seq);
    }
    out
}
