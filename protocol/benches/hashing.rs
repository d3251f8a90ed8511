//! What hashing a prompt's blocks costs, and which part of it is serial: the local hashes of
//! 512 blocks of 16 tokens (independent, so the core overlaps them), the sequence-hash chain
//! over those locals alone (each link waits on the previous one's XXH3), and both as the
//! route path runs them (`sequence_hashes`). The chain is the wire contract's (DESIGN: a
//! sequence hash is the XXH3 of its parent's and its own local hash), so its time is the
//! floor of any route path that queries an index keyed by sequence hashes
//! (docs/performance.md, "The KV index against Dynamo's").
//!
//! `cargo bench -p switchyard-protocol --bench hashing`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use switchyard_protocol::hash::{
    local_block_hashes, sequence_hashes, sequence_hashes_from, BlockSize, HashSeed,
};

fn bench_hashing(c: &mut Criterion) {
    let tokens: Vec<u32> = (0..8_192u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let block_size = BlockSize::try_new(16).expect("16 is a block size");
    let seed = HashSeed::default();
    let locals = local_block_hashes(&tokens, block_size, seed);
    // The chain over precomputed locals must give what the fused loop gives.
    assert_eq!(
        sequence_hashes_from(None, &locals, seed),
        sequence_hashes(&tokens, block_size, seed)
    );
    let mut group = c.benchmark_group("hash_8192_tokens");
    group.throughput(Throughput::Elements(locals.len() as u64));
    group.bench_function("local_hashes_only", |b| {
        b.iter(|| local_block_hashes(std::hint::black_box(&tokens), block_size, seed))
    });
    group.bench_function("chain_only", |b| {
        b.iter(|| sequence_hashes_from(None, std::hint::black_box(&locals), seed))
    });
    group.bench_function("local_and_chain", |b| {
        b.iter(|| sequence_hashes(std::hint::black_box(&tokens), block_size, seed))
    });
    group.finish();
}

criterion_group!(benches, bench_hashing);
criterion_main!(benches);
