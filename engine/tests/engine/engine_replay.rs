//! Replays the Mooncake conversation trace (one hour, ~12k requests, mean ISL ~12k tokens)
//! through eight simulated aggregated engines in virtual time and checks the replay is
//! complete and leak-free. It prints the wall time it took (no timed assertion: that is a
//! benchmark's job). The trace is the repository's `data/mooncake_conversation_trace.jsonl`.

use std::path::PathBuf;

use switchyard_engine::vtime::{trace_block_hashes, Arrival, Cluster, ClusterEvent};
use switchyard_engine::{EngineConfig, EngineOutput, EngineRequest, Prompt};
use switchyard_protocol::hash::HashSeed;
use switchyard_protocol::worker::WorkerRole;

fn trace_path() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("SWITCHYARD_TRACE").map(PathBuf::from),
        Some(PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../data/mooncake_conversation_trace.jsonl"
        ))),
    ];
    candidates.into_iter().flatten().find(|p| p.exists())
}

#[derive(serde::Deserialize)]
struct Row {
    timestamp: f64,
    input_length: u32,
    output_length: u32,
    hash_ids: Vec<u64>,
}

#[test]
fn mooncake_trace_replays_through_eight_engines() {
    let Some(path) = trace_path() else {
        assert!(
            std::env::var_os("SWITCHYARD_SKIP_TRACE_TESTS").is_some(),
            "no trace: expected data/mooncake_conversation_trace.jsonl in the \
             repository, or set SWITCHYARD_TRACE (SWITCHYARD_SKIP_TRACE_TESTS=1 skips this test)"
        );
        eprintln!("skipped: SWITCHYARD_SKIP_TRACE_TESTS is set");
        return;
    };
    let text = std::fs::read_to_string(&path).unwrap();
    let rows: Vec<Row> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();

    let mut cluster = Cluster::new();
    let mut cfg = EngineConfig::new(WorkerRole::Agg);
    cfg.emit_token_outputs = false; // TTFT and E2E only
    for i in 0..8 {
        cluster.add_engine(format!("agg-{i}"), cfg.clone()).unwrap();
    }
    for (id, row) in rows.iter().enumerate() {
        let block_hashes = trace_block_hashes(
            &row.hash_ids,
            row.input_length,
            512,
            64,
            HashSeed::default(),
        );
        let req = EngineRequest::local(
            id as u64,
            Prompt::Hashed {
                tokens: row.input_length,
                block_hashes,
            },
            row.output_length.max(1),
        );
        // Session-sticky enough for a smoke run: route by the row's second trace block
        // (the first is a shared system prompt in this trace).
        let engine = (row.hash_ids.get(1).copied().unwrap_or(0) % 8) as usize;
        cluster.schedule(row.timestamp, Arrival::Direct { engine, req });
    }

    #[allow(clippy::disallowed_methods)] // wall time of the replay, printed for information
    let started = std::time::Instant::now();
    let (mut finished, mut rejected, mut ttft_sum) = (0usize, 0usize, 0.0);
    let mut arrivals = std::collections::HashMap::new();
    for (id, row) in rows.iter().enumerate() {
        arrivals.insert(id as u64, row.timestamp);
    }
    cluster.run(&mut |e| match e {
        ClusterEvent::Output {
            output: EngineOutput::Finished { .. },
            ..
        } => finished += 1,
        ClusterEvent::Output {
            output: EngineOutput::FirstToken { id, at_ms, .. },
            ..
        } => {
            ttft_sum += at_ms - arrivals[&id];
        }
        ClusterEvent::Rejected { .. } => rejected += 1,
        _ => {}
    });
    let wall = started.elapsed();
    let hits: u64 = (0..8)
        .map(|i| cluster.engine(i).load().prefix_cache_hits)
        .sum();
    let queries: u64 = (0..8)
        .map(|i| cluster.engine(i).load().prefix_cache_queries)
        .sum();
    eprintln!(
        "replayed {} requests ({} rejected) in {:.1} s wall, {:.0} s virtual; mean TTFT {:.0} ms; \
         prefix hit rate {:.1} %",
        finished,
        rejected,
        wall.as_secs_f64(),
        cluster.now_ms() / 1_000.0,
        ttft_sum / finished.max(1) as f64,
        100.0 * hits as f64 / queries.max(1) as f64
    );
    assert_eq!(finished + rejected, rows.len());
    for i in 0..8 {
        assert_eq!(cluster.engine(i).load().kv_used_blocks, 0);
    }
}
