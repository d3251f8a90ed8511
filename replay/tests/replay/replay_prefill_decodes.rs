//! A prefill worker continuing decode: when the one decode worker's KV is full (long agentic
//! outputs on long contexts, 3 prefill : 1 decode), the router keeps requests on the prefill
//! workers (`agg:decode_pool_full`), which prefill and decode them themselves in the same
//! engine model; against the behaviour before it (every request queued for the full decode
//! worker's KV), requests get their first token far sooner and fewer are preempted.

use switchyard_loadgen::agentic::{generate_agentic, AgenticConfig};
use switchyard_loadgen::report::Slo;
use switchyard_protocol::route::{Reason, RouteMode};
use switchyard_replay::{report_run, run_mode, PromptSource, StackSpec};
use switchyard_router::config::ServingMode;

#[test]
fn a_full_decode_pool_leaves_requests_to_the_prefill_workers() {
    // data/agentic_long_outputs.json, smaller: long outputs keep streams on the decode worker.
    let config = AgenticConfig {
        sessions: 64,
        turns: 2,
        session_rate_per_s: 2.0,
        output_tokens: (2_000, 4_000),
        initial_context_tokens: (60_000, 120_000),
        ..AgenticConfig::default()
    };
    let workload = generate_agentic(&config, 0).unwrap();
    let source = PromptSource::synthetic(workload.content_seed);
    let slo = Slo {
        ttft_ms: Some(2_000.0),
        itl_ms: Some(40.0),
    };
    let run = |on: bool| {
        let mut spec = StackSpec::new(ServingMode::Disagg, 4, 3);
        spec.router.prefill_continues_decode = on;
        let run = run_mode(&workload, &source, spec).unwrap();
        assert!(
            run.records.iter().all(|r| r.ok()),
            "every request completes"
        );
        let report = report_run(&run, &workload, slo, None);
        (run, report)
    };
    let (kept, kept_report) = run(true);
    let (queued, queued_report) = run(false);
    let on_prefill: Vec<_> = kept
        .notes
        .iter()
        .filter(|n| n.reason == Reason::AggDecodePoolFull)
        .collect();
    assert!(!on_prefill.is_empty(), "the decode worker filled up");
    for n in &on_prefill {
        assert_eq!(n.mode, RouteMode::Agg);
        assert!(n.decode.starts_with("prefill-"), "{n:?}");
        assert_eq!(n.prefill, None);
        let r = &kept.records[n.id];
        assert_eq!(r.route.as_deref(), Some("agg"));
        assert_eq!(r.worker.as_deref(), Some(n.decode.as_str()));
    }
    assert!(queued.notes.iter().all(|n| n.mode == RouteMode::Disagg));
    let p50 = |r: &switchyard_loadgen::report::RunReport| r.ttft_ms.p50.unwrap();
    assert!(
        p50(&kept_report) < p50(&queued_report) / 2.0,
        "TTFT p50 {} against {}",
        p50(&kept_report),
        p50(&queued_report)
    );
    assert!(kept_report.goodput.requests_per_s > queued_report.goodput.requests_per_s);
    assert!(kept.counters.preemptions <= queued.counters.preemptions);
}
