//! The virtual stack's optional gateway stage: a burst sent at one instant reaches a single
//! prefill worker in trace order without it, shortest prompt first with it (as the real
//! stack's processor-shared tokenizations deliver it), and TTFT still counts from the send.

use switchyard_control_plane::config::ServingMode;
use switchyard_sim::loadgen::prompts::{PromptSpec, Segment};
use switchyard_sim::loadgen::{PlannedRequest, Workload};
use switchyard_sim::replay::{run_mode, GatewayModel, PromptSource, ReplayError, StackSpec};

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
    let gateway = GatewayModel {
        ms_per_prompt_token: 0.01,
        cpus: 1,
        decode_leg_ms_per_prompt_token: 0.0,
    };
    let t = ttfts(gateway);
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
    spec.gateway = GatewayModel {
        ms_per_prompt_token: 0.01,
        cpus: 0,
        decode_leg_ms_per_prompt_token: 0.0,
    };
    match run_mode(&workload, &source, spec) {
        Err(ReplayError::InvalidSetup(message)) => assert!(message.contains("cpus"), "{message}"),
        other => panic!("expected InvalidSetup, got {other:?}"),
    }
}
