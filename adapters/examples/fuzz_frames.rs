//! A bounded, deterministic stress run of the decoders: N inputs (argv[1], default 100,000;
//! seed argv[2]) made by mutating the captured vLLM messages (and some random bytes), through
//! [`decode_message`], the mapper and [`decode_reply`]. Counts outcomes and panics; exits 1 on
//! any panic, printing the first offending input in hex.
//!
//! ```sh
//! cargo run --release --example fuzz_frames -- 1000000
//! ```
//! (`fuzz/` has the coverage-guided libFuzzer target; this needs no nightly.)

use std::collections::BTreeMap;
use std::panic;
use std::time::Instant;

use switchyard_adapters::vllm::frame::decode_message;
use switchyard_adapters::vllm::mapper::{HashMapper, MapperConfig};
use switchyard_adapters::vllm::replay::decode_reply;
use switchyard_adapters::vllm::DecodeError;
use switchyard_protocol::hash::BlockSize;

const FIXTURES: &[&str] = &[
    include_str!("../tests/fixtures/vllm_0.32_block_stored_with_parent.hex"),
    include_str!("../tests/fixtures/vllm_0.32_block_stored_31_blocks.hex"),
    include_str!("../tests/fixtures/vllm_0.32_removed_then_stored.hex"),
    include_str!("../tests/fixtures/vllm_0.32_block_stored_bin_hashes.hex"),
    include_str!("../tests/fixtures/vllm_0.32_all_blocks_cleared.hex"),
];

/// Bytes that mean something to msgpack: nil, bools, wide ints, bin/str/array/map markers with
/// 8/16/32-bit lengths, floats, ext, and lengths that overrun.
const INTERESTING: &[u8] = &[
    0x00, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1, 0xc2, 0xc3, 0xc4, 0xc5, 0xc6, 0xc7,
    0xca, 0xcb, 0xcc, 0xcd, 0xce, 0xcf, 0xd0, 0xd3, 0xd4, 0xd9, 0xda, 0xdb, 0xdc, 0xdd, 0xde, 0xdf,
    0xe0, 0xff,
];

/// SplitMix64: tiny, fast, deterministic; good enough to drive mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
}

fn parse_fixture(text: &str) -> Vec<Vec<u8>> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|hex| {
            (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("fixture hex"))
                .collect()
        })
        .collect()
}

/// One mutation of `data`, sometimes splicing in a piece of `other`.
fn mutate(rng: &mut Rng, data: &mut Vec<u8>, other: &[u8]) {
    if data.is_empty() {
        data.push(rng.byte());
        return;
    }
    let i = rng.below(data.len());
    match rng.below(8) {
        0 => data[i] ^= 1 << rng.below(8),
        1 => data[i] = INTERESTING[rng.below(INTERESTING.len())],
        2 => data[i] = rng.byte(),
        3 => data.truncate(i),
        4 => {
            let n = 1 + rng.below(8);
            let bytes: Vec<u8> = (0..n).map(|_| rng.byte()).collect();
            data.splice(i..i, bytes);
        }
        5 => {
            let end = (i + 1 + rng.below(64)).min(data.len());
            data.drain(i..end);
        }
        6 => {
            let end = (i + 1 + rng.below(64)).min(data.len());
            let chunk = data[i..end].to_vec();
            let at = rng.below(data.len());
            data.splice(at..at, chunk);
        }
        _ => {
            if !other.is_empty() {
                let from = rng.below(other.len());
                let end = (from + 1 + rng.below(256)).min(other.len());
                data.splice(i..i, other[from..end].iter().copied());
            }
        }
    }
}

/// One input: a message's frames.
fn make_input(rng: &mut Rng, seeds: &[Vec<Vec<u8>>]) -> Vec<Vec<u8>> {
    let mut frames = seeds[rng.below(seeds.len())].clone();
    let other = seeds[rng.below(seeds.len())][2].clone();
    match rng.below(10) {
        // Mostly: a captured message with its payload mutated a few times.
        0..=6 => {
            for _ in 0..1 + rng.below(8) {
                mutate(rng, &mut frames[2], &other);
            }
        }
        // The topic and sequence number frames.
        7 => {
            let f = rng.below(2);
            for _ in 0..1 + rng.below(3) {
                mutate(rng, &mut frames[f], &[0xff, 0xfe, 0xc3]);
            }
        }
        // Random payload bytes.
        8 => frames[2] = (0..rng.below(300)).map(|_| rng.byte()).collect(),
        // Another number of frames.
        _ => {
            let n = rng.below(6);
            frames.resize(n, Vec::new());
        }
    }
    frames
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The error's variant name (and the event error's, for `Event`), for the summary.
fn variant(e: &DecodeError) -> String {
    let name = |debug: String| {
        debug
            .split([' ', '(', '{'])
            .next()
            .unwrap_or_default()
            .to_owned()
    };
    match e {
        DecodeError::Event { error, .. } => format!("Event/{}", name(format!("{error:?}"))),
        other => name(format!("{other:?}")),
    }
}

#[allow(clippy::disallowed_methods)] // reports the stress run's own speed; no result depends on it
fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("N: a number of inputs"))
        .unwrap_or(100_000);
    let seed: u64 = std::env::args()
        .nth(2)
        .map(|a| a.parse().expect("seed: a number"))
        .unwrap_or(0x5eed);
    let seeds: Vec<Vec<Vec<u8>>> = FIXTURES.iter().map(|t| parse_fixture(t)).collect();
    let mut rng = Rng(seed);
    let mut mapper = HashMapper::new(MapperConfig::new(BlockSize::try_new(32).expect("32")));
    panic::set_hook(Box::new(|_| {})); // panics are counted and reported below
    let (mut ok, mut err, mut events, mut panics) = (0u64, 0u64, 0u64, 0u64);
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let start = Instant::now();
    for _ in 0..n {
        let frames = make_input(&mut rng, &seeds);
        let result = panic::catch_unwind(panic::AssertUnwindSafe(|| {
            let decoded = decode_message(&frames);
            if let Ok(batch) = &decoded {
                // Whatever decodes also goes through the mapper.
                let mapped = mapper.apply_batch(batch);
                if mapper.len() > 1_000_000 {
                    mapper.reset();
                }
                let _ = mapped.kv_events().count();
            }
            // The same frames as a replay answer, behind the delimiter.
            let mut reply = vec![Vec::new()];
            reply.extend(frames.iter().cloned());
            let _ = decode_reply(&reply);
            decoded.map(|b| b.events.len())
        }));
        match result {
            Ok(Ok(count)) => {
                ok += 1;
                events += count as u64;
            }
            Ok(Err(e)) => {
                err += 1;
                *errors.entry(variant(&e)).or_default() += 1;
            }
            Err(_) => {
                if panics == 0 {
                    eprintln!("PANIC on input:");
                    for f in &frames {
                        eprintln!("  {}", hex(f));
                    }
                }
                panics += 1;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{n} inputs in {secs:.2} s ({:.0}/s): {ok} decoded ({events} events), {err} rejected with an error, {panics} panics",
        n as f64 / secs
    );
    for (kind, count) in &errors {
        println!("  {count:>9}  {kind}");
    }
    if panics > 0 {
        std::process::exit(1);
    }
}
