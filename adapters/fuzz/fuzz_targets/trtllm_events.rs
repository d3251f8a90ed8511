//! Fuzz target: arbitrary bytes as a TensorRT-LLM `POST /kv_cache_events` answer, through the
//! JSON decoder and the feed (and so the hash mapper). Nothing may panic.
//!
//! - With cargo-fuzz (nightly): `cargo +nightly fuzz run trtllm_events` in this directory
//!   (`-- -max_total_time=60` to bound it; a JSON dictionary helps: `-dict=...`).
//! - Without it, as a plain binary on one input: `cargo run --bin trtllm_events < input`.
#![cfg_attr(fuzzing, no_main)]

use switchyard_adapters::trtllm::decode::{decode_body, Limits};
use switchyard_adapters::trtllm::feed::TrtllmFeed;
use switchyard_adapters::vllm::mapper::MapperConfig;
use switchyard_protocol::hash::BlockSize;
use switchyard_protocol::worker::WorkerId;

fn run(data: &[u8]) {
    if let Ok(events) = decode_body(data, &Limits::DEFAULT) {
        let block_size = BlockSize::try_new(2).unwrap_or_else(|_| unreachable!());
        let mut feed = TrtllmFeed::new(WorkerId("w".into()), 1, MapperConfig::new(block_size));
        let _ = feed.on_poll(&events);
        // The same answer again: duplicates, restarts and removals of known blocks.
        let _ = feed.on_poll(&events);
    }
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
