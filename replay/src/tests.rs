//! Unit tests of the replay's pure parts (whole runs: `replay/tests/replay_*.rs`).

use switchyard_protocol::hash::{sequence_hashes, BlockSize, HashSeed};
use switchyard_protocol::route::{Reason, RouteMode};
use switchyard_protocol::worker::WorkerRole;
use switchyard_router::config::{RouterConfig, ServingMode};

use super::tokens::hashed_prompt;
use super::tracker::{RouteNote, Tracker};
use super::tuning::{recommend_from_sweep, recommendation_markdown};
use super::*;
use switchyard_engine::Prompt;
use switchyard_loadgen::prompts::{PromptSpec, Segment};
use switchyard_loadgen::record::RequestRecord;
use switchyard_loadgen::{ArrivalScale, PlannedRequest, Workload};

fn planned(id: usize, arrival_ms: u64, after: Vec<usize>, think_ms: u64) -> PlannedRequest {
    PlannedRequest {
        id,
        arrival_ms,
        session: 0,
        turn: id as u32,
        agent: 0,
        after,
        think_ms,
        prompt: PromptSpec {
            segments: vec![Segment {
                block: id as u64,
                tokens: 100,
            }],
        },
        osl: 5,
    }
}

fn workload_of(requests: Vec<PlannedRequest>) -> Workload {
    Workload {
        name: "w".into(),
        content_seed: 0,
        requests,
    }
}

fn note(isl: u32, eff_isl: u32) -> RouteNote {
    RouteNote {
        id: 0,
        at_ms: 0.0,
        mode: RouteMode::Bypass,
        reason: Reason::BypassIslBounding,
        isl,
        cached_tokens: isl - eff_isl,
        eff_isl,
        decode: "decode-0".into(),
        prefill: None,
    }
}

#[test]
fn roles_split_prefill_first_and_agg_uses_every_worker() {
    let spec = StackSpec::new(ServingMode::Disagg, 4, 1);
    assert_eq!(
        spec.roles().unwrap(),
        vec![
            WorkerRole::Prefill,
            WorkerRole::Decode,
            WorkerRole::Decode,
            WorkerRole::Decode
        ]
    );
    assert_eq!(spec.gpus(), 16);
    let agg = StackSpec::new(ServingMode::Agg, 3, 2);
    assert_eq!(agg.roles().unwrap(), vec![WorkerRole::Agg; 3]);
    assert!(StackSpec::new(ServingMode::Conditional, 3, 3)
        .roles()
        .is_err());
}

#[test]
fn dependents_wait_for_the_last_dependency_plus_think_time() {
    let workload = workload_of(vec![
        planned(0, 0, vec![], 0),
        planned(1, 100, vec![], 0),
        planned(2, 50, vec![0, 1], 1_000),
    ]);
    let mut t = Tracker::new(&workload, ArrivalScale::new(0.5).unwrap());
    let ready: Vec<_> = t.initially_ready(&workload).collect();
    assert_eq!(ready, vec![(0, 0.0), (1, 50.0)]);
    let record = |id| RequestRecord {
        id,
        ..RequestRecord::default()
    };
    t.on_sent(0, record(0), Some(note(100, 100)));
    t.on_sent(0, record(1), Some(note(100, 100)));
    assert!(t.on_finished(&workload, 0, 100, 5, 400.0).is_empty());
    // Failed dependencies release dependents too, as the load generator's client does.
    let ready = t.on_failed(&workload, 1, "engine: x".into(), 300.0);
    assert_eq!(ready, vec![(2, 400.0 + 500.0)]);
    assert_eq!(t.open(), 1);
    let (records, notes, not_sent) = t.finish();
    assert_eq!((records.len(), notes.len(), not_sent), (2, 2, 1));
    assert!(records[0].ok() && !records[1].ok());
    assert_eq!(records[0].e2e_ms, Some(400.0));
}

#[test]
fn measured_send_times_replace_planned_arrivals_of_open_loop_requests_only() {
    let workload = workload_of(vec![
        planned(0, 10, vec![], 0),
        planned(1, 10, vec![], 0),
        planned(2, 20, vec![], 0),
        planned(3, 0, vec![0], 7),
    ]);
    let mut t = Tracker::new(&workload, ArrivalScale::new(2.0).unwrap());
    // Request 1 was really sent before request 0; request 2's entry is missing (NaN).
    t.set_sent_override(vec![20.6, 20.2, f64::NAN, 1.0]);
    let ready: Vec<_> = t.initially_ready(&workload).collect();
    assert_eq!(ready, vec![(0, 20.6), (1, 20.2), (2, 40.0)]);
    t.on_sent(
        0,
        RequestRecord {
            id: 0,
            ..RequestRecord::default()
        },
        None,
    );
    // A closed-loop request still waits for its dependency and think time (× 2).
    assert_eq!(t.on_finished(&workload, 0, 100, 5, 100.0), vec![(3, 114.0)]);
}

#[test]
fn synthetic_prompts_have_the_planned_length_and_router_hashes() {
    let source = PromptSource::synthetic(7);
    let r = planned(3, 0, vec![], 0);
    let tokens = source.token_ids(&r);
    assert_eq!(tokens.len(), 100);
    assert_eq!(source.prompt_tokens(&r), 100);
    assert_eq!(tokens, source.token_ids(&r));
    let bs = BlockSize::try_new(64).unwrap();
    let Prompt::Hashed {
        tokens: n,
        block_hashes,
    } = hashed_prompt(&tokens, bs, HashSeed::default())
    else {
        panic!("hashed prompt expected");
    };
    assert_eq!(n, 100);
    assert_eq!(
        block_hashes,
        sequence_hashes(&tokens, bs, HashSeed::default())
    );
}

#[test]
fn distribution_percentiles_tenths_and_shares() {
    let notes: Vec<RouteNote> = (0..10).map(|i| note(1_000, i * 100)).collect();
    let d = EffIslDistribution::from_notes(&notes);
    assert_eq!(d.requests, 10);
    assert_eq!(d.ratio_tenths, [0.1; 10]);
    assert_eq!(d.cold_share, 0.0);
    assert_eq!(d.share_below(250), 0.3);
    assert_eq!(d.eff_isl_at(50.0), 450.0);
    assert_eq!(d.eff_isl.iter().find(|p| p.0 == 50.0).unwrap().1, 450.0);
    let cold = EffIslDistribution::from_notes(&[note(500, 500)]);
    assert_eq!(cold.cold_share, 1.0);
    assert_eq!(cold.ratio_tenths[9], 1.0);
}

fn point(threshold: u32, ratio: f64, goodput: f64, ttft_p90: f64, failed: usize) -> SweepPoint {
    use switchyard_loadgen::stats::Summary;
    SweepPoint {
        eff_isl_threshold: threshold,
        ratio_threshold: ratio,
        bypass_share: f64::from(threshold) / 20_000.0,
        ttft_ms: Summary {
            p90: Some(ttft_p90),
            ..Summary::default()
        },
        itl_ms: Summary::default(),
        e2e_ms: Summary::default(),
        output_tokens_per_s_per_gpu: 1.0,
        goodput_rps: goodput,
        // 100 requests per unit of goodput: different goodputs, different counts.
        goodput_requests: (goodput * 100.0).round() as usize,
        transfer_tokens: 0,
        failed,
    }
}

#[test]
fn the_recommendation_is_the_measured_best_with_ties_to_the_faster_first_token() {
    let points = [
        point(0, 0.7, 9.0, 1_900.0, 0),
        point(2_048, 0.7, 10.0, 1_350.0, 0),
        point(4_096, 1.0, 10.5, 1_240.0, 0),
        point(8_192, 1.0, 10.45, 900.0, 0),
        point(16_384, 1.0, 12.0, 600.0, 3),
    ];
    // 16,384 failed requests: not recommended. 8,192 is within 1 % of 4,096's goodput and
    // has the lower TTFT p90.
    let rec = recommend_from_sweep(&points, 0.01, (2_048, 0.7)).unwrap();
    assert_eq!(
        (rec.eff_isl_threshold, rec.eff_isl_ratio_threshold),
        (8_192, 1.0)
    );
    assert_eq!(rec.best_goodput_rps, 10.5);
    assert!((rec.goodput_ratio - 10.45 / 10.5).abs() < 1e-12);
    assert!((rec.default_goodput_ratio.unwrap() - 10.0 / 10.5).abs() < 1e-12);
    // Without tolerance the best goodput wins outright.
    let strict = recommend_from_sweep(&points, 0.0, (1, 0.1)).unwrap();
    assert_eq!(strict.eff_isl_threshold, 4_096);
    assert_eq!(strict.goodput_ratio, 1.0);
    assert_eq!(strict.default_goodput_ratio, None);
    let text = recommendation_markdown(&rec);
    assert!(text.contains("99.5 % of the best"), "{text}");
    assert!(recommend_from_sweep(&[], 0.01, (0, 0.7)).is_none());
    assert!(recommend_from_sweep(&points[4..], 0.01, (0, 0.7)).is_none());
}

#[test]
fn points_serving_as_many_requests_tie_whatever_their_windows() {
    // Without SLOs every point that serves all 285 requests has the same count; the rates
    // differ by a hair (when the last request finished). The lowest TTFT p90 decides.
    let mut a = point(4_096, 0.7, 2.854_57, 875.0, 0);
    let mut b = point(16_384, 1.0, 2.851_89, 769.0, 0);
    a.goodput_requests = 285;
    b.goodput_requests = 285;
    let points = [a, b];
    let rec = recommend_from_sweep(&points, 0.0, (2_048, 0.7)).unwrap();
    assert_eq!(
        (rec.eff_isl_threshold, rec.eff_isl_ratio_threshold),
        (16_384, 1.0)
    );
    assert!(
        recommendation_markdown(&rec).contains("points within 0 % of it"),
        "{}",
        recommendation_markdown(&rec)
    );
    let tolerant = recommend_from_sweep(&points, 0.004, (2_048, 0.7)).unwrap();
    let text = recommendation_markdown(&tolerant);
    assert!(text.contains("within 0.4 % of it"), "{text}");
}

/// A month between two arrivals (a trace mixing Unix-epoch and relative timestamps, or a
/// long pause) is skipped, not played message by message, and the second request is served
/// as the first was: idle workers, nothing changed meanwhile.
#[test]
fn a_month_of_idle_time_is_skipped_and_changes_nothing() {
    const MONTH_MS: u64 = 30 * 86_400_000;
    let workload = workload_of(vec![
        planned(0, 0, vec![], 0),
        planned(1, MONTH_MS, vec![], 0),
    ]);
    let source = PromptSource::synthetic(workload.content_seed);
    let run = VirtualStack::new(StackSpec::new(ServingMode::Agg, 2, 0), &workload, &source)
        .unwrap()
        .run()
        .unwrap();
    assert!(
        run.records.iter().all(RequestRecord::ok),
        "{:?}",
        run.records
    );
    let (a, b) = (&run.records[0], &run.records[1]);
    assert_eq!(b.sent_ms - a.sent_ms, MONTH_MS as f64);
    // Equal up to the float rounding of times a month from the start.
    let close = |x: Option<f64>, y: Option<f64>| (x.unwrap() - y.unwrap()).abs() < 1e-3;
    assert!(
        close(a.ttft_ms, b.ttft_ms) && close(a.e2e_ms, b.e2e_ms),
        "{a:?} {b:?}"
    );
    assert_eq!(run.counters.expired_workers, 0, "no worker looked silent");
    // Played message by message, a month is millions of load reports.
    assert!(run.counters.load_reports < 1_000, "{:?}", run.counters);
    assert!(run.counters.idle_skipped_ms > 29.0 * 86_400_000.0);
}

/// `slo_cost` decides against the objectives the runs are scored against unless the config
/// names its own; a config that would override each run's mode, or that the router refuses,
/// is refused naming the flag. switchyard-compare's real runs once used slo_cost's default
/// objectives while being scored against --slo-itl-ms.
#[test]
fn a_comparisons_router_config_takes_the_runs_objectives_unless_it_names_its_own() {
    use crate::spec::comparison_router;
    use switchyard_loadgen::report::Slo;
    let slo = Slo {
        ttft_ms: Some(500.0),
        itl_ms: Some(12.0),
    };
    let (filled, router) = comparison_router(Some(r#"{"policy":"slo_cost"}"#), slo).unwrap();
    assert_eq!(filled["slo_itl_ms"], 12.0);
    assert_eq!(filled["slo_ttft_ms"], 500.0);
    let (own, _) =
        comparison_router(Some(r#"{"policy":"slo_cost","slo_itl_ms":30}"#), slo).unwrap();
    assert_eq!(
        (own["slo_itl_ms"].as_f64(), own["slo_ttft_ms"].as_f64()),
        (Some(30.0), Some(500.0))
    );
    assert_eq!(router, RouterConfig::from_json(&filled).unwrap());
    assert_eq!(router.conditional.slo_itl_ms, 12.0);
    // Without objectives nothing is added.
    assert_eq!(
        comparison_router(None, Slo::default()).unwrap().0,
        serde_json::json!({})
    );
    for (text, named) in [
        (r#"{"serving_mode":"disagg"}"#, "leave serving_mode out"),
        ("[1]", "must be a JSON object"),
        ("{nope", "not JSON"),
        (
            r#"{"eff_isl_ratio_threshold":2}"#,
            "eff_isl_ratio_threshold",
        ),
    ] {
        let err = comparison_router(Some(text), slo).unwrap_err();
        assert!(
            err.contains(named) && err.contains("--conditional-disagg-config"),
            "{text}: {err}"
        );
    }
}
