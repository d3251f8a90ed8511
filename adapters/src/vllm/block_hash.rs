//! vLLM's block hashes as `u64`.
//!
//! vLLM hashes each block with SHA-256 (32 bytes) by default. By default
//! (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`) it publishes them as integers, computing
//! `int.from_bytes(digest, "big") & (2**64 - 1)`: the digest read as a big-endian number,
//! cut to its low 64 bits — its **last 8 bytes, read big-endian**. With the variable set to 0
//! it publishes the raw digest instead.
//!
//! [`from_bytes`] applies vLLM's own rule to a raw digest, so a block gets the same `u64`
//! (and so the same [`EngineBlockId`](switchyard_protocol::kv::EngineBlockId)) whichever way
//! the worker publishes, and workers configured differently agree. Shorter digests (vLLM's
//! xxhash options) follow the same rule: the number's low 64 bits.

/// Longest byte hash accepted (SHA-512's size); anything longer is not a hash.
pub const MAX_HASH_BYTES: usize = 64;

/// The `u64` vLLM would publish for the byte hash `bytes`: its last 8 bytes (fewer if it is
/// shorter), big-endian. `None` if `bytes` is empty or longer than [`MAX_HASH_BYTES`].
pub fn from_bytes(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() || bytes.len() > MAX_HASH_BYTES {
        return None;
    }
    let tail = bytes.get(bytes.len().saturating_sub(8)..)?;
    // Shifting left drops the high bytes, as `& (2**64 - 1)` does in vLLM.
    Some(
        tail.iter()
            .fold(0u64, |acc, &b| acc.wrapping_shl(8) | u64::from(b)),
    )
}

/// The `u64` for a hash that msgpack carried as a signed integer: vLLM's hashes are unsigned
/// 64-bit, and an encoder may write those ≥ 2^63 as negative int64; the bits are the same.
pub fn from_i64(value: i64) -> u64 {
    value.cast_unsigned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_digest_keeps_its_last_eight_bytes_big_endian() {
        let mut digest = [0u8; 32];
        digest[..24].fill(0xaa);
        digest[24..].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(from_bytes(&digest), Some(0x0102_0304_0506_0708));
    }

    #[test]
    fn short_hash_is_its_big_endian_value() {
        assert_eq!(from_bytes(&[0x12, 0x34]), Some(0x1234));
    }

    #[test]
    fn empty_or_oversized_is_not_a_hash() {
        assert_eq!(from_bytes(&[]), None);
        assert_eq!(from_bytes(&[0; MAX_HASH_BYTES + 1]), None);
        assert!(from_bytes(&[0; MAX_HASH_BYTES]).is_some());
    }

    #[test]
    fn negative_int64_keeps_its_bits() {
        assert_eq!(from_i64(-1), u64::MAX);
        assert_eq!(from_i64(i64::MIN), 1 << 63);
    }
}
