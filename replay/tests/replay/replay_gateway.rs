//! The virtual stack's optional gateway stage: a burst sent at one instant reaches a single
//! prefill worker in trace order without it, shortest prompt first with it (as the real
//! stack's processor-shared tokenizations deliver it), and TTFT still counts from the send;
//! a route call slower than the route timeout fails open to a decode worker that prefills the
//! request itself, as the filter does.

use switchyard_loadgen::prompts::{PromptSpec, Segment};
use switchyard_loadgen::{PlannedRequest, Workload};
use switchyard_replay::{run_mode, GatewayModel, PromptSource, ReplayError, StackSpec};
use switchyard_router::config::ServingMode;

fn cold_prompt(id: usize, first_block: u64, tokens: u32) -> PlannedRequest {
    let mut segments = Vec::new();
    let mut left = tokens;
    let mut block = first_block;
    while left > 0 {
        let n = left.min(512);
        segments.push(Segment { block, tokens: n });
        left -= n;
        block += 1;
    }
    PlannedRequest {
        id,
        arrival_ms: 1_000,
        session: id as u64,
        turn: 0,
        agent: 0,
        after: Vec::new(),
        think_ms: 0,
        prompt: PromptSpec { segments },
        osl: 10,
    }
}

/// Three cold prompts sent in the same millisecond, longest first.
fn burst() -> Workload {
    Workload {
        name: "burst".into(),
        content_seed: 5,
        requests: vec![
            cold_prompt(0, 100, 12_000),
            cold_prompt(1, 200, 6_000),
            cold_prompt(2, 300, 2_000),
        ],
    }
}

/// Route and worker tokenizations of `ms_per_token` each, all processor-shared on `cpus`.
fn shared(ms_per_token: f64, cpus: f64) -> GatewayModel {
    GatewayModel {
        body_ms_per_prompt_token: 0.0,
        route_ms_per_prompt_token: ms_per_token,
        route_ms_per_cached_token: ms_per_token,
        route_threads: 0,
        long_lane_min_tokens: 0,
        route_timeout_ms_per_token: 0.0,
        route_timeout_cap_ms: None,
        worker_ms_per_prompt_token: ms_per_token,
        worker_ms_per_cached_token: ms_per_token,
        cpus,
        decode_leg_ms_per_prompt_token: 0.0,
        decode_leg_ms_per_cached_token: 0.0,
        route_timeout_ms: None,
    }
}

fn ttfts(gateway: GatewayModel) -> Vec<f64> {
    let workload = burst();
    let source = PromptSource::synthetic(workload.content_seed);
    let mut spec = StackSpec::new(ServingMode::Disagg, 2, 1);
    spec.gateway = gateway;
    let run = run_mode(&workload, &source, spec).unwrap();
    assert!(
        run.records.iter().all(|r| r.sent_ms == 1_000.0),
        "sent at the arrival"
    );
    run.records.iter().map(|r| r.ttft_ms.unwrap()).collect()
}

#[test]
fn without_a_gateway_cost_a_burst_is_prefilled_in_trace_order() {
    let t = ttfts(GatewayModel::FREE);
    // The two shorter prompts finish their prefill in the same iteration.
    assert!(t[0] < t[1] && t[1] <= t[2], "{t:?}");
}

#[test]
fn a_gateway_cost_delivers_a_burst_shortest_first_and_counts_in_ttft() {
    // Route and worker tokenizations processor-shared (no route-thread bound), one core.
    let t = ttfts(shared(0.005, 1.0));
    assert!(t[2] < t[1] && t[1] < t[0], "{t:?}");
    // The shortest prompt shares the one core three ways until its 20 ms of work are done.
    let free = ttfts(GatewayModel::FREE);
    assert!(t[2] >= 60.0, "{t:?}");
    // Nobody skips the gateway: the longest one's TTFT includes all 200 ms of CPU work
    // before its prefill even starts.
    assert!(t[0] >= 200.0 && t[0] > free[0], "{t:?} vs {free:?}");
}

#[test]
fn a_gateway_without_cores_is_rejected() {
    let workload = burst();
    let source = PromptSource::synthetic(workload.content_seed);
    let mut spec = StackSpec::new(ServingMode::Agg, 2, 0);
    spec.gateway = shared(0.005, 0.0);
    match run_mode(&workload, &source, spec) {
        Err(ReplayError::InvalidSetup(message)) => assert!(message.contains("cpus"), "{message}"),
        other => panic!("expected InvalidSetup, got {other:?}"),
    }
}

/// The burst through two route threads on two cores, route timeout `timeout_ms`.
fn run_with_timeout(timeout_ms: Option<f64>) -> switchyard_replay::ReplayRun {
    let workload = burst();
    let source = PromptSource::synthetic(workload.content_seed);
    let mut spec = StackSpec::new(ServingMode::Disagg, 3, 1);
    spec.gateway = GatewayModel {
        route_threads: 2,
        route_timeout_ms: timeout_ms,
        ..shared(0.01, 2.0)
    };
    run_mode(&workload, &source, spec).unwrap()
}

#[test]
fn a_route_call_slower_than_the_timeout_fails_open_to_a_local_prefill() {
    // Route calls of 120 ms (12k), 60 ms (6k) and 20 ms (2k) on two threads: the 6k one is
    // routed at 60 ms, the 2k one starts then and, sharing two cores three ways with the 6k
    // one's worker tokenization and the 12k route call, is routed at 90 ms. The 12k call has
    // 33 ms of work left at the 100 ms timeout: it fails open.
    let run = run_with_timeout(Some(100.0));
    let routes: Vec<&str> = run
        .records
        .iter()
        .map(|r| r.route.as_deref().unwrap())
        .collect();
    // The filter's own label for a route call that timed out.
    assert_eq!(routes, vec!["fail-open;reason=timeout", "disagg", "disagg"]);
    assert_eq!(run.counters.failed_open, 1);
    // The failed-open request was prefilled by its decode worker: only the two routed ones
    // went through the prefill worker and moved their KV.
    assert_eq!(run.counters.transfers, 2);
    assert_eq!(run.counters.transfer_tokens, 8_000);
    assert!(
        run.records[0]
            .worker
            .as_deref()
            .is_some_and(|w| w.starts_with("decode")),
        "{:?}",
        run.records[0].worker
    );
    // The router never saw it (no route note), and every request completed.
    assert_eq!(
        run.notes.iter().map(|n| n.id).collect::<Vec<_>>(),
        vec![1, 2]
    );
    assert!(run
        .records
        .iter()
        .all(|r| r.status == Some(200) && r.ttft_ms.is_some()));

    // Without a timeout the same burst is routed whole, and disaggregated.
    let patient = run_with_timeout(None);
    assert!(patient
        .records
        .iter()
        .all(|r| r.route.as_deref() == Some("disagg")));
    assert_eq!(patient.counters.failed_open, 0);
    assert_eq!(patient.counters.transfers, 3);
}

/// The model's context is enforced as on the real stack: a prompt that leaves no room for a
/// generated token is refused 400 by the control plane (or, when its route call timed out, by
/// the worker it failed open to), and an output longer than the context leaves is cut.
#[test]
fn prompts_beyond_the_context_are_refused_and_long_outputs_cut() {
    let workload = burst();
    let source = PromptSource::synthetic(workload.content_seed);
    let prompt_tokens: Vec<u64> = workload
        .requests
        .iter()
        .map(|r| source.prompt_tokens(r))
        .collect();
    // Room for the 6k prompt and 4 output tokens of the 10 asked; none for the 12k prompt.
    let max_model_len = u32::try_from(prompt_tokens[1]).unwrap() + 4;
    let mut spec = StackSpec::new(ServingMode::Disagg, 2, 1);
    spec.max_model_len = max_model_len;
    let run = run_mode(&workload, &source, spec).unwrap();
    let refused = &run.records[0];
    assert_eq!(refused.status, Some(400), "{refused:?}");
    assert_eq!(
        refused.route.as_deref(),
        Some("rejected;reason=prompt_too_long")
    );
    assert!(
        refused
            .error
            .as_deref()
            .is_some_and(|e| e.contains(&format!("maximum context length is {max_model_len}"))),
        "{refused:?}"
    );
    assert_eq!(run.counters.refused_for_context, 1);
    assert_eq!(run.records[1].status, Some(200));
    assert_eq!(
        run.records[1].completion_tokens,
        Some(4),
        "cut to the context"
    );
    assert_eq!(run.records[2].completion_tokens, Some(10));
    // The router never saw the refused one.
    assert_eq!(
        run.notes.iter().map(|n| n.id).collect::<Vec<_>>(),
        vec![1, 2]
    );

    // Failed open, the worker refuses it alike, under the fail-open label, once it has read
    // the prompt: a turn that follows it goes out only then.
    let mut workload = workload;
    let mut follow_up = cold_prompt(3, 400, 1_000);
    follow_up.after = vec![0];
    workload.requests.push(follow_up);
    let mut spec = StackSpec::new(ServingMode::Disagg, 3, 1);
    spec.gateway = GatewayModel {
        route_threads: 2,
        route_timeout_ms: Some(100.0),
        ..shared(0.01, 2.0)
    };
    spec.max_model_len = max_model_len;
    let run = run_mode(&workload, &source, spec).unwrap();
    let refused = &run.records[0];
    assert_eq!(refused.status, Some(400), "{refused:?}");
    assert_eq!(refused.route.as_deref(), Some("fail-open;reason=timeout"));
    assert_eq!(
        (run.counters.failed_open, run.counters.refused_for_context),
        (1, 1)
    );
    // Sent at 1,000 ms, failed open at its 100 ms timeout, then 12k tokens read by the worker.
    let follow_up_sent = run.records[3].sent_ms;
    assert!(follow_up_sent > 1_150.0, "sent at {follow_up_sent} ms");
}
