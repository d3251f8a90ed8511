//! The deployment planner on a small slice of the Mooncake trace: every point measured with
//! finite numbers, each mode's best is the best of its points, the recommendation the best of
//! the bests, threads change nothing, and the time bound stops points from starting.

use std::sync::atomic::{AtomicUsize, Ordering};

use switchyard_loadgen::report::Slo;
use switchyard_loadgen::trace_file::load_trace;
use switchyard_loadgen::{LoadLevel, Workload};
use switchyard_replay::planner::{
    plan_deployment, write_plan, Execution, PlanOutcome, PlanSpace, PointMetrics, PointOutcome,
};
use switchyard_replay::{PromptSource, StackSpec, ThresholdGrid};
use switchyard_router::config::ServingMode;

const TRACE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../data/mooncake_conversation_trace.jsonl"
);

fn slice() -> Workload {
    let mut w = load_trace(std::path::Path::new(TRACE), None, 512, 0)
        .expect("the Mooncake trace in data/")
        .workload;
    w.truncate(60);
    w
}

fn space() -> PlanSpace {
    PlanSpace {
        workers: 3,
        modes: vec![
            ServingMode::Agg,
            ServingMode::Disagg,
            ServingMode::Conditional,
        ],
        load_levels: vec![LoadLevel::PLANNED, LoadLevel::new(4.0).unwrap()],
        thresholds: ThresholdGrid {
            eff_isl_thresholds: vec![0, 4096],
            ratio_thresholds: vec![0.7],
        },
        slo_cost: false,
    }
}

const SLO: Slo = Slo {
    ttft_ms: Some(1500.0),
    itl_ms: Some(30.0),
};

fn plan(jobs: usize, budget: usize) -> PlanOutcome {
    let workload = slice();
    let starts = AtomicUsize::new(0);
    // A budget of `budget` point starts stands in for the clock.
    let out_of_time = || starts.fetch_add(1, Ordering::SeqCst) >= budget;
    let execution = Execution {
        jobs,
        out_of_time: &out_of_time,
        on_point_done: &|_| {},
    };
    let source = PromptSource::synthetic(workload.content_seed);
    let base = StackSpec::new(ServingMode::Agg, 3, 0);
    plan_deployment(&workload, &source, &base, &space(), SLO, &execution).unwrap()
}

#[test]
fn every_point_runs_and_the_best_is_the_best_measured() {
    let outcome = plan(2, usize::MAX);
    // Per level: agg + disagg 1:2, 2:1 + conditional 2 splits × 2 thresholds.
    assert_eq!(outcome.results.len(), 2 * 7);
    assert_eq!(outcome.measured(), outcome.results.len());
    let metrics: Vec<PointMetrics> = outcome
        .results
        .iter()
        .map(|r| PointMetrics::of(r).unwrap())
        .collect();
    for m in &metrics {
        assert!(m.goodput_rps.is_finite() && m.goodput_rps >= 0.0, "{m:?}");
        assert!(m.tokens_per_s_per_gpu.is_finite() && m.tokens_per_s_per_gpu > 0.0);
        assert!(m.interactivity_p50.is_some_and(f64::is_finite));
    }
    for s in &outcome.summaries {
        let best = s.best.expect("every mode ran");
        let max = outcome
            .results
            .iter()
            .zip(&metrics)
            .filter(|(r, _)| r.point.mode == s.mode)
            .map(|(_, m)| m.goodput_rps)
            .fold(f64::NEG_INFINITY, f64::max);
        assert_eq!(best.metrics.goodput_rps, max, "{:?}", s.mode);
        assert!(!s.frontier.is_empty());
    }
    let rec = outcome.recommendation.as_ref().unwrap();
    let overall = metrics.iter().map(|m| m.goodput_rps).fold(0.0, f64::max);
    assert_eq!(rec.best.metrics.goodput_rps, overall);
    assert_eq!(rec.others.len(), 2);
    assert!(rec
        .others
        .iter()
        .all(|gap| (0.0..=1.0).contains(&gap.goodput_ratio)));

    // One thread gives the same numbers: points are independent and deterministic.
    let serial = plan(1, usize::MAX);
    let serial_metrics: Vec<PointMetrics> = serial
        .results
        .iter()
        .map(|r| PointMetrics::of(r).unwrap())
        .collect();
    assert_eq!(serial_metrics, metrics);

    let dir = std::env::temp_dir().join(format!("replay-plan-{}", std::process::id()));
    let markdown = write_plan(&dir, &outcome).unwrap();
    assert!(markdown.contains("## Recommended"), "{markdown}");
    for file in [
        "plan.md",
        "plan.json",
        "frontier_throughput.svg",
        "frontier_goodput.svg",
    ] {
        assert!(dir.join(file).exists(), "{file}");
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("plan.json")).unwrap()).unwrap();
    assert_eq!(json["results"].as_array().unwrap().len(), 14);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_time_bound_stops_points_from_starting_and_says_so() {
    let outcome = plan(1, 3);
    assert_eq!(outcome.measured(), 3, "three starts allowed");
    assert_eq!(outcome.not_run(), outcome.results.len() - 3);
    assert!(outcome.results[3..]
        .iter()
        .all(|r| matches!(r.outcome, PointOutcome::NotRun)));
    let markdown = switchyard_replay::planner::plan_markdown(&outcome);
    assert!(markdown.contains("11 not run"), "{markdown}");
    // The recommendation says it is the best of what ran, and names the modes that did not.
    assert!(
        markdown.contains("11 of 14 points did not run** (the time bound or an interrupt"),
        "{markdown}"
    );
    let none = plan(2, 0);
    assert_eq!(none.measured(), 0);
    assert!(none.recommendation.is_none());
}
