//! The comparison runner end to end, small and bounded: a six-request trace through real
//! nats-server, control plane, simulated workers and Envoy with the filter (debug binaries,
//! workers 4x faster), once per serving mode, plus the virtual-time cross-check of the same
//! runs. It proves the runner produces a complete report for every mode with no request lost
//! or failed; it asserts no timing (that is what `switchyard-compare --cross-check` and
//! docs/benchmarks.md are for).
//!
//! Needs `cargo build --workspace --bins` and the wasm filter (`scripts/test.sh` builds
//! both); a missing artifact fails with the command that builds it.

use std::path::PathBuf;

use switchyard_stack::compare::{run_comparison, CompareConfig, WorkloadSpec};
use switchyard_stack::{stop_children_on_signal, Profile, SpeedUp};

/// Six requests, three of them turns of one conversation (shared leading blocks), so the
/// conditional policy has cached prefixes to weigh. `hash_ids` cover 512 tokens each.
const TRACE: &str = r#"{"timestamp": 0, "input_length": 1200, "output_length": 8, "hash_ids": [0, 1, 2]}
{"timestamp": 100, "input_length": 1700, "output_length": 8, "hash_ids": [0, 1, 2, 3]}
{"timestamp": 200, "input_length": 600, "output_length": 8, "hash_ids": [10, 11]}
{"timestamp": 300, "input_length": 2000, "output_length": 8, "hash_ids": [0, 1, 2, 3]}
{"timestamp": 400, "input_length": 300, "output_length": 8, "hash_ids": [20]}
{"timestamp": 500, "input_length": 2600, "output_length": 8, "hash_ids": [0, 1, 2, 3, 4, 5]}
"#;

/// Removes the test's folder when the test ends, also on panic.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mode_gets_a_complete_report_through_envoy() {
    stop_children_on_signal();
    let dir = TempDir(
        std::env::temp_dir().join(format!("switchyard-compare-smoke-{}", std::process::id())),
    );
    std::fs::create_dir_all(&dir.0).unwrap();
    let trace = dir.0.join("trace.jsonl");
    std::fs::write(&trace, TRACE).unwrap();

    let mut config = CompareConfig::new(
        WorkloadSpec::Trace {
            path: trace,
            block_tokens: switchyard_loadgen::trace::MOONCAKE_BLOCK_TOKENS,
            form: None,
        },
        dir.0.join("out"),
    );
    config.workers = 3;
    config.prefill_ratio = 0.34;
    config.speed_up = SpeedUp::new(4.0).unwrap();
    config.profile = Profile::Debug;
    config.max_run_s = 30.0;
    config.drain_s = 15.0;
    config.request_timeout_s = 20.0;
    config.cross_check = true;
    let comparison = run_comparison(&config).await.expect("comparison runs");

    let modes: Vec<&str> = comparison
        .runs
        .iter()
        .map(|r| r.run.mode.as_str())
        .collect();
    assert_eq!(modes, ["agg", "disagg", "conditional"]);
    for run in &comparison.runs {
        let r = &run.report;
        let label = &r.meta.label;
        assert_eq!(r.requests.sent, 6, "{label}: {:?}", r.requests);
        assert_eq!(r.requests.ok, 6, "{label}: errors {:?}", r.errors);
        assert_eq!((r.requests.failed, r.requests.not_sent), (0, 0), "{label}");
        assert!(r.errors.is_empty(), "{label}: {:?}", r.errors);
        assert_eq!(r.meta.gpus, 12, "{label}: 3 workers of 4 GPUs");
        assert_eq!(r.meta.speed_up.factor(), 4.0, "{label}");
        // Every request went through the filter: each response names its route.
        assert!(
            !r.routes.modes.contains_key("none"),
            "{label}: {:?}",
            r.routes
        );
        let share = r.routes.bypass_share.expect("routed requests");
        assert!(
            (0.0..=1.0).contains(&share),
            "{label}: bypass share {share}"
        );
        for (name, p50) in [("TTFT", r.ttft_ms.p50), ("ITL", r.itl_ms.p50)] {
            let p50 = p50.unwrap_or(f64::NAN);
            assert!(p50.is_finite() && p50 > 0.0, "{label}: {name} p50 {p50}");
        }
        assert_eq!(r.tokens.output_count_mismatches, 0, "{label}");
        // The control plane answered: at least one request carries its mode's own verdict
        // (not only fail-open), so the run compared the mode it names.
        let verdicts: &[&str] = match run.run.mode.as_str() {
            "agg" => &["agg"],
            "disagg" => &["disagg"],
            _ => &["bypass", "disagg"],
        };
        let routed: usize = verdicts.iter().filter_map(|m| r.routes.modes.get(*m)).sum();
        assert!(
            routed > 0,
            "{label}: no verdict of its mode: {:?}",
            r.routes
        );
        assert!(run.detail.dir.join("report.json").is_file(), "{label}");
        assert!(run.detail.dir.join("records.jsonl").is_file(), "{label}");
    }
    // Aggregated serving never bypasses (there is no prefill pool), disaggregated never
    // does either: only conditional serving may.
    assert_eq!(comparison.runs[0].report.routes.bypass_share, Some(0.0));
    assert_eq!(comparison.runs[1].report.routes.bypass_share, Some(0.0));
    let out = &config.out;
    let md = std::fs::read_to_string(out.join("comparison.md")).unwrap();
    for label in ["agg@x1", "disagg@x1", "conditional@x1"] {
        assert!(md.contains(label), "comparison.md lacks {label}:\n{md}");
    }
    assert!(out.join("comparison.json").is_file());
    // The cross-check replays every run in virtual time with the gateway cost measured on
    // this machine (the tokenizations in front of the engines; docs/benchmarks.md).
    assert_eq!(comparison.cross_check.len(), 3);
    assert_eq!(comparison.virtual_runs.len(), 3);
    for v in &comparison.virtual_runs {
        assert_eq!(v.requests.ok, 6, "{}: {:?}", v.meta.label, v.requests);
    }
    let gateway = comparison
        .gateway_model
        .expect("cross-check measures the gateway");
    assert!(
        gateway.route_ms_per_prompt_token > 0.0 && gateway.route_ms_per_prompt_token.is_finite(),
        "{gateway:?}"
    );
    assert!(gateway.cpus > 0.0 && gateway.cpus <= 256.0);
    assert!(md.contains("Virtual runs model the gateway"), "{md}");
    let svg = std::fs::read_to_string(out.join("throughput_vs_interactivity.svg")).unwrap();
    assert!(svg.contains("<svg"), "plot is not an SVG");
}
