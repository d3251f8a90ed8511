//! [`VllmEvent`]s → the bytes vLLM's ZMQ publisher sends: the msgpack payload
//! `[ts, events, data_parallel_rank]` and the three-frame message `[topic, seq, payload]`.
//!
//! This is the decoder ([`super::frame`]) run backwards, for anything that must *look like* a
//! vLLM engine on the wire (Switchyard's simulated workers, stand-ins in tests). It writes
//! what vLLM 0.32 writes, byte for byte for the events it captured (see the adapters' tests):
//! - events as maps keyed by field name with `type` first ([`EventEncoding::Map`], vLLM
//!   0.32), or as the older tag-first arrays ([`EventEncoding::Array`]);
//! - block hashes as integers ([`HashEncoding::Int`], vLLM's default) or as 32-byte digests
//!   ([`HashEncoding::Bytes`], `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`);
//! - integers, strings and containers in msgpack's shortest form, as Python's `msgpack`
//!   (behind vLLM's `msgspec`) does.
//!
//! What a [`VllmEvent`] does not carry is written as vLLM writes it for a plain text model:
//! `lora_name` nil, `kv_cache_spec_kind` `"full_attention"`, and `extra_keys` one nil per block
//! (or, when [`VllmEvent::BlockStored::hashed_with_extra_keys`] is set, one empty array per
//! block: a stand-in for whatever else vLLM hashed, which the decoder only tests for nil).
//! In the map form, an absent `medium` or `group_idx` is left out (the decoder reads it back
//! as absent); the array form is written as the versions before `group_idx` wrote it.
//!
//! The replay socket's answer frames are in [`super::replay`]
//! ([`encode_reply_batch`](super::replay::encode_reply_batch),
//! [`encode_reply_end`](super::replay::encode_reply_end)).

use rmpv::Value;

use super::batch::{VllmBatch, VllmEvent};
use super::names::{
    ALL_BLOCKS_CLEARED, BLOCK_HASHES, BLOCK_REMOVED, BLOCK_SIZE, BLOCK_STORED, EXTRA_KEYS,
    FULL_ATTENTION, GROUP_IDX, KV_CACHE_SPEC_KIND, LORA_ID, LORA_NAME, MEDIUM, PARENT_BLOCK_HASH,
    TOKEN_IDS, TYPE,
};

/// Length of a byte hash written with [`HashEncoding::Bytes`]: a SHA-256 digest's.
pub const HASH_BYTES: usize = 32;
/// The zero bytes before the hash's 8 in such a digest.
const HASH_PADDING: usize = HASH_BYTES - 8;

/// How events are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EventEncoding {
    /// Maps keyed by field name with `type` (vLLM 0.32).
    #[default]
    Map,
    /// Tag-first arrays (older vLLM): `["BlockStored", block_hashes, parent_block_hash,
    /// token_ids, block_size, lora_id, medium, lora_name, extra_keys]`, `["BlockRemoved",
    /// block_hashes, medium]`, `["AllBlocksCleared"]`.
    Array,
}

/// How block hashes are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HashEncoding {
    /// As integers (vLLM's default): msgpack's shortest unsigned form.
    #[default]
    Int,
    /// As 32-byte digests: 24 zero bytes, then the hash big-endian. vLLM's integer form of a
    /// digest is its last 8 bytes read big-endian ([`super::block_hash::from_bytes`]), so a
    /// reader gets the same `u64` either way.
    Bytes,
}

/// How a payload is written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EncodeOptions {
    /// The event encoding.
    pub events: EventEncoding,
    /// The hash encoding.
    pub hashes: HashEncoding,
}

/// The msgpack writer failed. Writing into a `Vec` does not fail, so this is not expected;
/// it is an error rather than a panic because the encoder is library code.
#[derive(Debug, thiserror::Error)]
#[error("cannot write msgpack: {0}")]
pub struct EncodeError(#[from] rmpv::encode::Error);

/// The payload `[ts, events, data_parallel_rank]` (a `None` rank is written as nil, as vLLM's
/// `msgspec` writes an unset optional field).
///
/// # Errors
/// [`EncodeError`] if the msgpack writer fails.
pub fn encode_payload(
    ts: f64,
    events: &[VllmEvent],
    data_parallel_rank: Option<i64>,
    options: EncodeOptions,
) -> Result<Vec<u8>, EncodeError> {
    let value = Value::Array(vec![
        Value::F64(ts),
        Value::Array(events.iter().map(|e| event(e, options)).collect()),
        data_parallel_rank.map_or(Value::Nil, Value::from),
    ]);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &value)?;
    Ok(out)
}

/// The three frames of one message: `[topic, seq (8 bytes, big-endian), payload]`.
pub fn encode_message(topic: &str, seq: u64, payload: Vec<u8>) -> [Vec<u8>; 3] {
    [topic.as_bytes().to_vec(), encode_seq(seq).to_vec(), payload]
}

/// A sequence number frame: 8 bytes, big-endian (what [`super::frame::decode_seq`] reads).
pub fn encode_seq(seq: u64) -> [u8; 8] {
    seq.to_be_bytes()
}

/// The whole message for `batch` (its `skipped` notes are the decoder's and are not written).
///
/// # Errors
/// [`EncodeError`] if the msgpack writer fails.
pub fn encode_batch(
    batch: &VllmBatch,
    options: EncodeOptions,
) -> Result<[Vec<u8>; 3], EncodeError> {
    let payload = encode_payload(batch.ts, &batch.events, batch.data_parallel_rank, options)?;
    Ok(encode_message(&batch.topic, batch.seq, payload))
}

fn hash(value: u64, encoding: HashEncoding) -> Value {
    match encoding {
        HashEncoding::Int => Value::from(value),
        HashEncoding::Bytes => {
            let mut digest = vec![0u8; HASH_PADDING];
            digest.extend_from_slice(&value.to_be_bytes());
            Value::Binary(digest)
        }
    }
}

fn hashes(values: &[u64], encoding: HashEncoding) -> Value {
    Value::Array(values.iter().map(|&h| hash(h, encoding)).collect())
}

fn opt_str(value: Option<&str>) -> Value {
    value.map_or(Value::Nil, Value::from)
}

fn key(name: &str) -> Value {
    Value::from(name)
}

fn event(event: &VllmEvent, options: EncodeOptions) -> Value {
    match event {
        VllmEvent::BlockStored {
            block_hashes,
            parent,
            token_ids,
            block_size,
            lora_id,
            medium,
            group_idx,
            hashed_with_extra_keys,
        } => {
            let per_block = if *hashed_with_extra_keys {
                Value::Array(Vec::new())
            } else {
                Value::Nil
            };
            let extra_keys = Value::Array(vec![per_block; block_hashes.len()]);
            let parent = parent.map_or(Value::Nil, |p| hash(p, options.hashes));
            let tokens = Value::Array(token_ids.iter().map(|&t| Value::from(t)).collect());
            let lora_id = lora_id.map_or(Value::Nil, Value::from);
            match options.events {
                EventEncoding::Map => {
                    let mut entries = vec![
                        (key(TYPE), key(BLOCK_STORED)),
                        (key(BLOCK_HASHES), hashes(block_hashes, options.hashes)),
                        (key(PARENT_BLOCK_HASH), parent),
                        (key(TOKEN_IDS), tokens),
                        (key(BLOCK_SIZE), Value::from(*block_size)),
                        (key(LORA_ID), lora_id),
                    ];
                    if let Some(m) = medium {
                        entries.push((key(MEDIUM), Value::from(m.as_str())));
                    }
                    entries.push((key(LORA_NAME), Value::Nil));
                    entries.push((key(EXTRA_KEYS), extra_keys));
                    if let Some(g) = group_idx {
                        entries.push((key(GROUP_IDX), Value::from(*g)));
                    }
                    entries.push((key(KV_CACHE_SPEC_KIND), key(FULL_ATTENTION)));
                    Value::Map(entries)
                }
                EventEncoding::Array => Value::Array(vec![
                    key(BLOCK_STORED),
                    hashes(block_hashes, options.hashes),
                    parent,
                    tokens,
                    Value::from(*block_size),
                    lora_id,
                    opt_str(medium.as_deref()),
                    Value::Nil,
                    extra_keys,
                ]),
            }
        }
        VllmEvent::BlockRemoved {
            block_hashes,
            medium,
            group_idx,
        } => match options.events {
            EventEncoding::Map => {
                let mut entries = vec![
                    (key(TYPE), key(BLOCK_REMOVED)),
                    (key(BLOCK_HASHES), hashes(block_hashes, options.hashes)),
                ];
                if let Some(m) = medium {
                    entries.push((key(MEDIUM), Value::from(m.as_str())));
                }
                if let Some(g) = group_idx {
                    entries.push((key(GROUP_IDX), Value::from(*g)));
                }
                Value::Map(entries)
            }
            EventEncoding::Array => Value::Array(vec![
                key(BLOCK_REMOVED),
                hashes(block_hashes, options.hashes),
                opt_str(medium.as_deref()),
            ]),
        },
        VllmEvent::AllBlocksCleared => match options.events {
            EventEncoding::Map => Value::Map(vec![(key(TYPE), key(ALL_BLOCKS_CLEARED))]),
            EventEncoding::Array => Value::Array(vec![key(ALL_BLOCKS_CLEARED)]),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vllm::frame::decode_message;

    #[test]
    fn an_empty_batch_is_three_items_with_a_nil_rank() {
        let payload = encode_payload(1.5, &[], None, EncodeOptions::default()).unwrap();
        // fixarray(3), float64 1.5, fixarray(0), nil.
        assert_eq!(
            payload,
            [0x93, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 0x90, 0xc0]
        );
    }

    #[test]
    fn byte_hashes_read_back_as_the_same_integers() {
        let events = [VllmEvent::BlockRemoved {
            block_hashes: vec![u64::MAX, 7],
            medium: Some("GPU".into()),
            group_idx: None,
        }];
        let options = EncodeOptions {
            hashes: HashEncoding::Bytes,
            ..EncodeOptions::default()
        };
        let payload = encode_payload(0.0, &events, Some(0), options).unwrap();
        let batch = decode_message(&encode_message("t", 3, payload)).unwrap();
        assert_eq!(batch.events, events);
        assert_eq!((batch.seq, batch.topic.as_str()), (3, "t"));
    }
}
