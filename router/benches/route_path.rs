//! The router's own share of a route call at 8k / 32k / 128k tokens: block hashing, the
//! index match, the load tracker and the KV predictions, for a warm multi-turn prompt whose
//! earlier turns the decode worker holds, while `ACTIVE` earlier turns of the same
//! conversation are still in flight on it (an agent's sub-calls, or a busy worker).
//! Run: `cargo bench -p switchyard-router --bench route_path`.

use std::hint::black_box;
use std::time::Duration;

use criterion::Criterion;
use switchyard_protocol::hash::{sequence_hashes, BlockSize, HashSeed};
use switchyard_protocol::kv::{EngineBlockId, KvEvent, KvEventBatch, StoredBlock};
use switchyard_protocol::lifecycle::LifecycleEvent;
use switchyard_protocol::worker::{WorkerId, WorkerInfo, WorkerRole};
use switchyard_router::config::RouterConfig;
use switchyard_router::Router;

const BLOCK_SIZE: u32 = 16;
/// Requests of the conversation in flight on the decode worker while one more is routed.
const ACTIVE: usize = 64;

fn info(id: &str, role: WorkerRole) -> WorkerInfo {
    WorkerInfo {
        worker_id: WorkerId(id.into()),
        instance_id: 1,
        role,
        address: format!("{id}:8000"),
        model: "m".into(),
        block_size: BLOCK_SIZE,
        kv_capacity_blocks: 1_000_000,
        engine: Default::default(),
        bootstrap_port: None,
    }
}

/// Deterministic token ids standing in for a conversation's text.
fn tokens(salt: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| {
            salt.wrapping_mul(1_000_003)
                .wrapping_add(i.wrapping_mul(7919))
                % 150_000
        })
        .collect()
}

/// A router whose `decode-0` holds `history` and has `ACTIVE` turns of it in flight.
fn warm_router(history: &[u32]) -> Router {
    let mut router = Router::with_config(RouterConfig::default(), 7);
    for (id, role) in [
        ("decode-0", WorkerRole::Decode),
        ("decode-1", WorkerRole::Decode),
        ("prefill-0", WorkerRole::Prefill),
    ] {
        router.upsert_worker(&info(id, role), 3_000, 0);
    }
    let hashes = sequence_hashes(
        history,
        BlockSize::try_new(BLOCK_SIZE).expect("block size"),
        HashSeed::default(),
    );
    let stored = KvEventBatch {
        v: 1,
        worker_id: WorkerId("decode-0".into()),
        instance_id: 1,
        seq: 1,
        resync: false,
        events: vec![KvEvent::Stored {
            parent: None,
            parent_block_id: None,
            blocks: hashes
                .iter()
                .enumerate()
                .map(|(i, &seq_hash)| StoredBlock {
                    seq_hash,
                    block_id: EngineBlockId(i as u64),
                })
                .collect(),
            block_size: BLOCK_SIZE,
        }],
    };
    router.apply_kv_batch(&stored).expect("stored");
    for i in 0..ACTIVE {
        let mut turn = history.to_vec();
        turn.extend(tokens(1_000 + i as u32, 40));
        router
            .route(&format!("active-{i}"), &turn, 10)
            .expect("route");
    }
    router
}

fn done(id: &str) -> LifecycleEvent {
    LifecycleEvent::completed(id)
}

fn route_path(c: &mut Criterion) {
    let mut group = c.benchmark_group("route_path");
    group.measurement_time(Duration::from_secs(4));
    for (label, n) in [("8k", 8_192), ("32k", 32_768), ("128k", 131_072)] {
        let history = tokens(1, n);
        let mut router = warm_router(&history);
        let mut turn = history.clone();
        turn.extend(tokens(2, 40));
        let mut i = 0u64;
        group.bench_function(format!("warm {label}, {ACTIVE} in flight"), |b| {
            b.iter(|| {
                i += 1;
                let id = format!("bench-{i}");
                let verdict = router.route(&id, black_box(&turn), 20).expect("route");
                // Keep the in-flight set constant: this request completes at once.
                router.apply_lifecycle(&done(&id), 20);
                verdict
            })
        });
    }
    group.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    route_path(&mut c);
    c.final_summary();
}
