//! The full one-hour Mooncake conversation trace (12,031 requests) in all three serving
//! modes in virtual time, with the control plane's router deciding every request, plus a
//! threshold sweep on its first part.
//!
//! The trace is the repository's `data/mooncake_conversation_trace.jsonl` (`data/README.md`;
//! `SWITCHYARD_MOONCAKE_TRACE` overrides the path). A missing trace fails these tests with a
//! message saying where it was looked for, unless `SWITCHYARD_SKIP_TRACE_TESTS=1`.

use std::path::PathBuf;

use switchyard_loadgen::report::Slo;
use switchyard_loadgen::trace::{plan_trace, read_trace, MOONCAKE_BLOCK_TOKENS};
use switchyard_loadgen::Workload;
use switchyard_protocol::route::RouteMode;
use switchyard_replay::{
    compare_modes, sweep_thresholds, EffIslDistribution, PromptSource, StackSpec, ThresholdGrid,
};
use switchyard_router::config::ServingMode;

/// Requests in the published trace.
const TRACE_REQUESTS: usize = 12_031;

/// The planned trace, or `None` when the caller asked to skip trace tests.
fn mooncake() -> Option<Workload> {
    let path = std::env::var_os("SWITCHYARD_MOONCAKE_TRACE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../data/mooncake_conversation_trace.jsonl"
            ))
        });
    if !path.exists() {
        if std::env::var("SWITCHYARD_SKIP_TRACE_TESTS").as_deref() == Ok("1") {
            eprintln!("skipping: {} missing", path.display());
            return None;
        }
        panic!(
            "the Mooncake trace is missing at {} (it belongs in the repository's data/; set \
             SWITCHYARD_MOONCAKE_TRACE=PATH, or SWITCHYARD_SKIP_TRACE_TESTS=1 to skip)",
            path.display()
        );
    }
    let parsed = read_trace(&path, MOONCAKE_BLOCK_TOKENS).expect("readable trace");
    assert!(parsed.malformed.is_empty(), "{:?}", &parsed.malformed[..1]);
    Some(plan_trace(&parsed, MOONCAKE_BLOCK_TOKENS, 0))
}

/// Wall seconds since `start`, printed so CI logs show the replay speed (never asserted).
#[allow(clippy::disallowed_methods)] // the simulator's own speed needs the wall clock
fn wall(start: Option<std::time::Instant>) -> (std::time::Instant, f64) {
    let now = std::time::Instant::now();
    (now, start.map_or(0.0, |s| (now - s).as_secs_f64()))
}

#[test]
fn full_trace_in_all_three_modes_is_sane() {
    let Some(workload) = mooncake() else { return };
    assert_eq!(workload.requests.len(), TRACE_REQUESTS);
    let source = PromptSource::synthetic(workload.content_seed);
    let base = StackSpec::new(ServingMode::Conditional, 8, 2);
    let modes = [
        ServingMode::Agg,
        ServingMode::Disagg,
        ServingMode::Conditional,
    ];
    let (start, _) = wall(None);
    let runs = compare_modes(&workload, &source, &base, &modes, Slo::default()).unwrap();
    let (_, secs) = wall(Some(start));
    eprintln!("three modes over the full trace: {secs:.1} s wall");

    for m in &runs {
        let (run, report) = (&m.run, &m.report);
        let mode = report.meta.mode.clone().unwrap();
        eprintln!(
            "{mode}: TTFT p50 {:?} p99 {:?}, ITL p50 {:?} p99 {:?}, bypass {:?}, {:?}",
            report.ttft_ms.p50,
            report.ttft_ms.p99,
            report.itl_ms.p50,
            report.itl_ms.p99,
            report.routes.bypass_share,
            run.counters
        );
        assert_eq!(run.not_sent, 0, "{mode}");
        assert_eq!(report.requests.sent, TRACE_REQUESTS, "{mode}");
        assert_eq!(
            report.requests.ok, TRACE_REQUESTS,
            "{mode}: {:?}",
            report.errors
        );
        assert!(report.errors.is_empty(), "{mode}: {:?}", report.errors);
        assert_eq!(
            run.counters.route_errors + run.counters.rejected,
            0,
            "{mode}"
        );
        assert_eq!(run.counters.kv_batch_problems, 0, "{mode}");
        // Every simulated `Stored` event named its parent's engine id: the index's hash
        // table kept heads only.
        assert!(!run.counters.index_every_hash, "{mode}");
        assert_eq!(report.tokens.output_count_mismatches, 0, "{mode}");
        assert_eq!(report.tokens.prompt_count_mismatches, 0, "{mode}");
        for s in [&report.ttft_ms, &report.itl_ms, &report.e2e_ms] {
            for v in [s.p50, s.p90, s.p99, s.mean] {
                let v = v.unwrap_or(f64::NAN);
                assert!(v.is_finite() && v > 0.0, "{mode}: {s:?}");
            }
        }
        assert!(report.throughput.output_tokens_per_s_per_gpu > 0.0);
        assert_eq!(report.meta.gpus, 32);
    }
    let by_mode = |mode: &str| {
        runs.iter()
            .find(|m| m.report.meta.mode.as_deref() == Some(mode))
            .unwrap()
    };
    let count = |mode: &str, route: RouteMode| {
        by_mode(mode)
            .run
            .notes
            .iter()
            .filter(|n| n.mode == route)
            .count()
    };
    assert_eq!(count("agg", RouteMode::Agg), TRACE_REQUESTS);
    assert_eq!(by_mode("agg").run.counters.transfers, 0);
    assert_eq!(count("disagg", RouteMode::Disagg), TRACE_REQUESTS);
    assert_eq!(count("disagg", RouteMode::Bypass), 0);
    let share = by_mode("conditional").report.routes.bypass_share.unwrap();
    assert!(
        share > 0.0 && share < 1.0,
        "conditional bypass share {share}"
    );
    assert_eq!(count("conditional", RouteMode::Agg), 0);
    // Conditional moves KV only for what it did not bypass.
    let moved = |mode: &str| by_mode(mode).run.counters.transfer_tokens;
    assert!(moved("conditional") < moved("disagg"));

    // The trace reuses prefixes (about 37 % of input tokens with an unlimited cache): the
    // router must have seen cached prefixes, and the distribution must be usable for tuning.
    let dist = EffIslDistribution::from_notes(&by_mode("conditional").run.notes);
    assert!(dist.cold_share > 0.0 && dist.cold_share < 1.0, "{dist:?}");
    assert!(dist.share_below(2048) > 0.0);
}

#[test]
fn bypass_share_grows_with_the_threshold() {
    let Some(mut workload) = mooncake() else {
        return;
    };
    workload.truncate(1_500);
    let source = PromptSource::synthetic(workload.content_seed);
    let base = StackSpec::new(ServingMode::Conditional, 4, 1);
    let grid = ThresholdGrid {
        eff_isl_thresholds: vec![0, 1024, 4096, 16_384, 1 << 20],
        ratio_thresholds: vec![1.0],
    };
    let points = sweep_thresholds(&workload, &source, &base, &grid, Slo::default()).unwrap();
    let shares: Vec<f64> = points.iter().map(|p| p.bypass_share).collect();
    eprintln!("bypass shares {shares:?}");
    assert_eq!(shares[0], 0.0, "threshold 0 never bypasses");
    assert!(
        shares.windows(2).all(|w| w[0] <= w[1]),
        "not monotonic: {shares:?}"
    );
    assert!(shares[shares.len() - 1] > shares[1]);
    // With ratio 1.0 and no absolute bound, everything with any cached prefix bypasses, and
    // TTFT of bypassed requests no longer waits for the prefill pool and transfer.
    assert!(points.iter().all(|p| p.failed == 0));
    assert!(points[4].transfer_tokens < points[0].transfer_tokens);
}
