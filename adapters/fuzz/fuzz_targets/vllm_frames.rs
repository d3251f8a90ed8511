//! Fuzz target: arbitrary bytes, split into the three frames of a vLLM KV event message,
//! through the frame decoder, the mapper and the replay decoder. Nothing may panic.
//!
//! - With cargo-fuzz (nightly): `cargo +nightly fuzz run vllm_frames` in this directory
//!   (`-- -max_total_time=60` to bound it). Seed corpus: `fuzz/seeds/vllm_frames/`.
//! - Without it, as a plain binary on one input: `cargo run --bin vllm_frames < input`.
#![cfg_attr(fuzzing, no_main)]

use switchyard_adapters::vllm::frame::decode_message;
use switchyard_adapters::vllm::mapper::{HashMapper, MapperConfig};
use switchyard_adapters::vllm::replay::decode_reply;
use switchyard_protocol::hash::BlockSize;

/// Splits `data` into `[topic, seq, payload]`: the first byte's low nibble is the topic's
/// length; the second byte is the seq frame's length (8, the valid one, unless it is ≥ 0xf0:
/// then its low nibble); the rest is the payload.
fn split(data: &[u8]) -> [&[u8]; 3] {
    let (topic_len, rest) = match data.split_first() {
        Some((&b, rest)) => (usize::from(b & 0x0f), rest),
        None => (0, data),
    };
    let (seq_len, rest) = match rest.split_first() {
        Some((&b, rest)) if b >= 0xf0 => (usize::from(b & 0x0f), rest),
        Some((_, rest)) => (8, rest),
        None => (8, rest),
    };
    let (topic, rest) = rest.split_at(topic_len.min(rest.len()));
    let (seq, payload) = rest.split_at(seq_len.min(rest.len()));
    [topic, seq, payload]
}

fn run(data: &[u8]) {
    let frames = split(data);
    if let Ok(batch) = decode_message(&frames) {
        let block_size = BlockSize::try_new(32).unwrap_or_else(|_| unreachable!());
        let mut mapper = HashMapper::new(MapperConfig::new(block_size));
        let _ = mapper.apply_batch(&batch);
    }
    let _ = decode_reply(&[&[][..], frames[0], frames[1], frames[2]]);
}

#[cfg(fuzzing)]
libfuzzer_sys::fuzz_target!(|data: &[u8]| run(data));

#[cfg(not(fuzzing))]
fn main() {
    use std::io::Read;
    let mut data = Vec::new();
    std::io::stdin()
        .read_to_end(&mut data)
        .unwrap_or_else(|e| panic!("reading stdin: {e}"));
    run(&data);
    println!("ok: {} bytes, no panic", data.len());
}
