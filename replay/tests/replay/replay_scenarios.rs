//! Virtual-time replay on small hand-built and synthetic workloads: the router's verdicts
//! show up in the records, runs are deterministic, closed-loop sessions complete.

use switchyard_loadgen::agentic::{generate_agentic, AgenticConfig};
use switchyard_loadgen::prompts::{PromptSpec, Segment};
use switchyard_loadgen::report::Slo;
use switchyard_loadgen::{PlannedRequest, Workload};
use switchyard_protocol::route::RouteMode;
use switchyard_replay::modes::report_run;
use switchyard_replay::{compare_modes, run_mode, PromptSource, StackSpec};
use switchyard_router::config::ServingMode;

/// `tokens` tokens as 512-token segments of content blocks `first_block..`.
fn blocks(first_block: u64, tokens: u32) -> Vec<Segment> {
    let mut out = Vec::new();
    let mut left = tokens;
    let mut block = first_block;
    while left > 0 {
        let n = left.min(512);
        out.push(Segment { block, tokens: n });
        left -= n;
        block += 1;
    }
    out
}

fn request(id: usize, arrival_ms: u64, session: u64, segments: Vec<Segment>) -> PlannedRequest {
    PlannedRequest {
        id,
        arrival_ms,
        session,
        turn: 0,
        agent: 0,
        after: Vec::new(),
        think_ms: 0,
        prompt: PromptSpec { segments },
        osl: 20,
    }
}

/// Session 0: a cold 8k-token first turn, then (after it finished) a second turn that resends
/// it plus 300 new tokens. Session 1: a cold 12k-token prompt arriving with the second turn.
fn two_turns_and_a_cold_prompt() -> Workload {
    let first = blocks(1_000, 8_192);
    let mut second = first.clone();
    second.extend(blocks(5_000, 300));
    let mut turn2 = request(1, 10_000, 0, second);
    turn2.turn = 1;
    Workload {
        name: "hand-built".into(),
        content_seed: 3,
        requests: vec![
            request(0, 0, 0, first),
            turn2,
            request(2, 10_000, 1, blocks(9_000, 12_000)),
        ],
    }
}

#[test]
fn conditional_bypasses_a_second_turn_and_disaggregates_cold_prompts() {
    let workload = two_turns_and_a_cold_prompt();
    let source = PromptSource::synthetic(workload.content_seed);
    let spec = StackSpec::new(ServingMode::Conditional, 2, 1);
    let run = run_mode(&workload, &source, spec).unwrap();
    assert_eq!(run.records.len(), 3);
    assert!(run.records.iter().all(|r| r.ok()), "{:?}", run.records);

    let routes: Vec<_> = run.records.iter().map(|r| r.route.as_deref()).collect();
    assert_eq!(
        routes,
        vec![Some("disagg"), Some("bypass"), Some("disagg")],
        "{:?}",
        run.notes
    );
    let reasons: Vec<&str> = run.notes.iter().map(|n| n.reason.as_str()).collect();
    assert_eq!(
        reasons,
        vec![
            "disagg:eff_isl_above_threshold",
            "bypass:isl_bounding",
            "disagg:eff_isl_above_threshold"
        ]
    );
    // The router saw the first turn's prompt (whole 64-token blocks) cached on the decode
    // worker, and the decode engine then served it from its prefix cache.
    let second = &run.notes[1];
    assert_eq!(second.cached_tokens, 8_192);
    assert_eq!(second.eff_isl, 300);
    assert_eq!(run.records[1].cached_tokens, Some(8_192));
    assert_eq!(run.records[1].worker.as_deref(), Some("decode-0"));
    // Two disaggregated requests moved their prompts' KV; the bypass moved nothing.
    assert_eq!(run.counters.transfers, 2);
    assert_eq!(run.counters.transfer_tokens, 8_192 + 12_000);
    assert_eq!(run.counters.kv_batch_problems, 0);
    assert!(!run.counters.index_every_hash);
    // A bypass prefills 300 tokens locally: its TTFT is far below the cold prompts'.
    let ttft: Vec<f64> = run.records.iter().map(|r| r.ttft_ms.unwrap()).collect();
    assert!(ttft[1] < ttft[0] && ttft[1] < ttft[2], "{ttft:?}");
    let report = report_run(&run, &workload, Slo::default(), None);
    assert_eq!(report.routes.bypass_share, Some(1.0 / 3.0));
}

#[test]
fn agg_and_disagg_modes_route_only_their_way() {
    let workload = two_turns_and_a_cold_prompt();
    let source = PromptSource::synthetic(workload.content_seed);
    let base = StackSpec::new(ServingMode::Conditional, 2, 1);
    let modes = [ServingMode::Agg, ServingMode::Disagg];
    let runs = compare_modes(&workload, &source, &base, &modes, Slo::default()).unwrap();
    let agg = &runs[0].run;
    assert!(agg.notes.iter().all(|n| n.mode == RouteMode::Agg));
    assert!(agg.notes.iter().all(|n| n.decode.starts_with("agg-")));
    assert_eq!(agg.counters.transfers, 0);
    // Aggregated workers keep the first turn's cache too: the second turn lands on it.
    assert_eq!(agg.notes[1].decode, agg.notes[0].decode);
    assert_eq!(agg.notes[1].cached_tokens, 8_192);
    let disagg = &runs[1].run;
    assert!(disagg.notes.iter().all(|n| n.mode == RouteMode::Disagg));
    assert_eq!(disagg.counters.transfers, 3);
    assert_eq!(runs[0].report.meta.gpus, 8);
    assert_eq!(runs[1].report.meta.mode.as_deref(), Some("disagg"));
}

fn small_agentic() -> Workload {
    let config = AgenticConfig {
        sessions: 4,
        turns: 6,
        session_rate_per_s: 2.0,
        initial_context_tokens: (2_000, 20_000),
        ..AgenticConfig::default()
    };
    generate_agentic(&config, 11).unwrap()
}

#[test]
fn same_seed_same_results_and_closed_loop_sessions_complete() {
    let workload = small_agentic();
    assert!(workload.requests.iter().any(|r| !r.after.is_empty()));
    let source = PromptSource::synthetic(workload.content_seed);
    let spec = StackSpec::new(ServingMode::Conditional, 3, 1);
    let a = run_mode(&workload, &source, spec.clone()).unwrap();
    let b = run_mode(&workload, &source, spec).unwrap();
    assert_eq!(a.records, b.records);
    assert_eq!(a.notes, b.notes);
    assert_eq!(a.counters, b.counters);
    assert_eq!(a.records.len(), workload.requests.len());
    assert!(a.records.iter().all(|r| r.ok()));
    // Every dependent turn was sent after all the turns it waits for had finished.
    for r in &workload.requests {
        let sent = a.records[r.id].sent_ms;
        for &d in &r.after {
            let done = a.records[d].done_ms().unwrap();
            assert!(
                sent >= done,
                "request {} sent at {sent} before {d} ended {done}",
                r.id
            );
        }
    }
    // Agentic turns resend their context: most are bypassed.
    let bypass = a
        .notes
        .iter()
        .filter(|n| n.mode == RouteMode::Bypass)
        .count();
    assert!(bypass * 2 > a.notes.len(), "{bypass} of {}", a.notes.len());
}

#[test]
fn bad_setups_are_rejected_with_clear_errors() {
    let workload = two_turns_and_a_cold_prompt();
    let source = PromptSource::synthetic(0);
    for (mode, workers, prefill) in [
        (ServingMode::Conditional, 2, 0),
        (ServingMode::Disagg, 2, 2),
        (ServingMode::Agg, 0, 0),
    ] {
        let err = run_mode(&workload, &source, StackSpec::new(mode, workers, prefill))
            .expect_err("invalid setup");
        assert!(err.to_string().contains("invalid replay setup"), "{err}");
    }
    let mut spec = StackSpec::new(ServingMode::Conditional, 2, 1);
    spec.router.conditional.eff_isl_ratio_threshold = 1.5;
    let err = run_mode(&workload, &source, spec).expect_err("bad ratio");
    assert!(err.to_string().contains("eff_isl_ratio_threshold"), "{err}");
    let mut shuffled = workload.clone();
    shuffled.requests.swap(0, 1);
    let err =
        run_mode(&shuffled, &source, StackSpec::new(ServingMode::Agg, 1, 0)).expect_err("bad ids");
    assert!(
        err.to_string().contains("ids must equal positions"),
        "{err}"
    );
}
