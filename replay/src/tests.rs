//! Unit tests of the replay's pure parts (whole runs: `replay/tests/replay_*.rs`).

use switchyard_protocol::hash::{sequence_hashes, BlockSize, HashSeed};
use switchyard_protocol::route::{Reason, RouteMode};
use switchyard_protocol::worker::WorkerRole;
use switchyard_router::config::ServingMode;

use super::tokens::hashed_prompt;
use super::tracker::{RouteNote, Tracker};
use super::tuning::pick_from_sweep;
use super::*;
use switchyard_engine::{PerfModel, Prompt};
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

fn point(threshold: u32, bypass: f64, ttft_p90: f64, itl_p99: f64) -> SweepPoint {
    use switchyard_loadgen::stats::Summary;
    SweepPoint {
        eff_isl_threshold: threshold,
        ratio_threshold: 1.0,
        bypass_share: bypass,
        ttft_ms: Summary {
            p90: Some(ttft_p90),
            ..Summary::default()
        },
        itl_ms: Summary {
            p99: Some(itl_p99),
            ..Summary::default()
        },
        e2e_ms: Summary::default(),
        output_tokens_per_s_per_gpu: 1.0,
        goodput_rps: 1.0,
        transfer_tokens: 0,
        failed: 0,
    }
}

#[test]
fn sweep_pick_is_the_fastest_first_token_within_the_itl_slack() {
    let points = [
        point(0, 0.0, 1_900.0, 12.0),
        point(2_048, 0.4, 1_350.0, 12.4),
        point(4_096, 0.5, 1_240.0, 12.6),
        point(16_384, 0.85, 600.0, 34.0),
    ];
    assert_eq!(
        pick_from_sweep(&points, 0.1).unwrap().eff_isl_threshold,
        4_096
    );
    assert_eq!(pick_from_sweep(&points, 0.02).unwrap().eff_isl_threshold, 0);
    assert_eq!(
        pick_from_sweep(&points, 2.0).unwrap().eff_isl_threshold,
        16_384
    );
    assert!(pick_from_sweep(&[], 0.1).is_none());
}

#[test]
fn threshold_is_the_largest_block_multiple_within_the_stall_budget() {
    let perf = PerfModel::default();
    let notes: Vec<RouteNote> = (0..100).map(|i| note(10_000, i * 100)).collect();
    let d = EffIslDistribution::from_notes(&notes);
    let rec = recommend_thresholds(&d, &perf, 64, 50.0);
    let cached = d.cached_p50 as u64;
    let t = u64::from(rec.eff_isl_threshold);
    assert_eq!(t % 64, 0);
    assert!(perf.prefill_chunk_ms(t, cached) <= 50.0);
    assert!(perf.prefill_chunk_ms(t + 64, cached) > 50.0);
    assert_eq!(rec.eff_isl_ratio_threshold, 1.0);
    assert_eq!(
        rec.share_below_threshold,
        d.share_below(rec.eff_isl_threshold)
    );
    // A bigger budget allows a bigger threshold; none below the fixed iteration cost.
    assert!(recommend_thresholds(&d, &perf, 64, 100.0).eff_isl_threshold > t as u32);
    assert_eq!(
        recommend_thresholds(&d, &perf, 64, 1.0).eff_isl_threshold,
        0
    );
}
