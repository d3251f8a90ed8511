//! Shared by the integration tests: the captured fixtures and msgpack built by hand.
#![allow(dead_code)] // each test file uses a different part

use rmpv::Value;

/// The five captured messages, by fixture name.
pub const CAPTURES: &[(&str, &str)] = &[
    (
        "vllm_0.32_block_stored_with_parent.hex",
        include_str!("../../fixtures/vllm_0.32_block_stored_with_parent.hex"),
    ),
    (
        "vllm_0.32_block_stored_31_blocks.hex",
        include_str!("../../fixtures/vllm_0.32_block_stored_31_blocks.hex"),
    ),
    (
        "vllm_0.32_removed_then_stored.hex",
        include_str!("../../fixtures/vllm_0.32_removed_then_stored.hex"),
    ),
    (
        "vllm_0.32_block_stored_bin_hashes.hex",
        include_str!("../../fixtures/vllm_0.32_block_stored_bin_hashes.hex"),
    ),
    (
        "vllm_0.32_all_blocks_cleared.hex",
        include_str!("../../fixtures/vllm_0.32_all_blocks_cleared.hex"),
    ),
];

/// The three frames of the fixture called `name`.
pub fn fixture(name: &str) -> Vec<Vec<u8>> {
    let text = CAPTURES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, t)| *t)
        .unwrap_or_else(|| panic!("no fixture {name}"));
    parse_fixture(text)
}

/// A fixture's frames: every non-comment line is one frame in hex.
pub fn parse_fixture(text: &str) -> Vec<Vec<u8>> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(unhex)
        .collect()
}

pub fn unhex(hex: &str) -> Vec<u8> {
    assert!(hex.len().is_multiple_of(2), "odd hex length");
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex digit"))
        .collect()
}

/// msgpack bytes of `value`.
pub fn pack(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, value).expect("writing to a Vec");
    out
}

/// A full message `[topic, seq, payload]` with topic `kv-events`.
pub fn message(seq: u64, payload: &Value) -> Vec<Vec<u8>> {
    vec![
        b"kv-events".to_vec(),
        seq.to_be_bytes().to_vec(),
        pack(payload),
    ]
}

/// A payload `[ts, events, dp_rank]`.
pub fn payload(events: Vec<Value>) -> Value {
    Value::Array(vec![
        Value::F64(1_796_153_746.0),
        Value::Array(events),
        Value::from(0),
    ])
}

pub fn s(text: &str) -> Value {
    Value::from(text)
}

pub fn ints<T: Into<Value> + Copy>(items: &[T]) -> Value {
    Value::Array(items.iter().map(|&i| i.into()).collect())
}

/// A map-form event (vLLM 0.32) from `(key, value)` pairs.
pub fn map(entries: Vec<(&str, Value)>) -> Value {
    Value::Map(entries.into_iter().map(|(k, v)| (s(k), v)).collect())
}

/// A vLLM 0.32 `BlockStored` with the fields vLLM always sends.
pub fn stored_map(hashes: &[u64], parent: Option<u64>, tokens: &[u32], block_size: u32) -> Value {
    map(vec![
        ("type", s("BlockStored")),
        ("block_hashes", ints(hashes)),
        ("parent_block_hash", parent.map_or(Value::Nil, Value::from)),
        ("token_ids", ints(tokens)),
        ("block_size", Value::from(block_size)),
        ("lora_id", Value::Nil),
        ("medium", s("GPU")),
        ("lora_name", Value::Nil),
        ("extra_keys", Value::Array(vec![Value::Nil; hashes.len()])),
        ("group_idx", Value::from(0)),
        ("kv_cache_spec_kind", s("full_attention")),
    ])
}

/// Token ids `start, start+1, ...`, `n` of them.
pub fn tokens(start: u32, n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| start + i).collect()
}
