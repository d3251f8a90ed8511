//! Property tests across policies, and the shared test input.

use proptest::prelude::*;

use super::*;
use crate::config::{ConditionalDisaggConfig, GUARD_KNOB};
use switchyard_protocol::route::RouteMode;

/// A request with `isl`/`eff_isl`, an idle prefill pool and a roomy decode worker.
pub(crate) fn input(isl: u32, eff_isl: u32) -> PolicyInput {
    PolicyInput {
        isl,
        eff_isl,
        prefill_queued_tokens: 0,
        decode_projected_blocks: 0,
        decode_capacity_blocks: 1_000_000,
        prefill_cached_tokens: 0,
        decode_queued_tokens: 0,
        decode_running_streams: 0,
        stall_rescue_scale: 0.0,
    }
}

fn any_input() -> impl Strategy<Value = PolicyInput> {
    (
        0u32..200_000,
        0u32..=100,
        0u64..100_000,
        0u64..20_000,
        0u64..20_000,
        (0u32..=100, 0u64..100_000, 0u32..300, 0.0f64..64.0),
    )
        .prop_map(
            |(isl, pct, queued, projected, capacity, (p_pct, d_queued, running, rescue))| {
                PolicyInput {
                    isl,
                    eff_isl: (u64::from(isl) * u64::from(pct) / 100) as u32,
                    prefill_queued_tokens: queued,
                    decode_projected_blocks: projected,
                    decode_capacity_blocks: capacity,
                    prefill_cached_tokens: (u64::from(isl) * u64::from(p_pct) / 100) as u32,
                    decode_queued_tokens: d_queued,
                    decode_running_streams: running,
                    stall_rescue_scale: rescue,
                }
            },
        )
}

fn any_config() -> impl Strategy<Value = ConditionalDisaggConfig> {
    (
        prop_oneof![
            Just(PolicyKind::IslBounding),
            Just(PolicyKind::PrefillLoad),
            Just(PolicyKind::IslOrLoad),
            Just(PolicyKind::SloCost)
        ],
        0u32..10_000,
        0.0f64..=1.0,
        0.0f64..3.0,
        1u64..100_000,
        proptest::option::of(0.0f64..1.5),
        any_timing(),
    )
        .prop_map(
            |(policy, t, r, busy, budget, guard, timing)| ConditionalDisaggConfig {
                policy,
                eff_isl_threshold: t,
                eff_isl_ratio_threshold: r,
                prefill_busy_threshold: busy,
                prefill_queue_budget_tokens: budget,
                decode_busy_threshold: guard,
                ..timing
            },
        )
}

/// `slo_cost`'s SLOs and coefficients around the GB200 defaults (the other fields default).
fn any_timing() -> impl Strategy<Value = ConditionalDisaggConfig> {
    (
        (1.0f64..100.0, 0.0f64..50.0, 1.0f64..10_000.0),
        (0.0f64..0.05, 0.0f64..2e-6, 1u32..20_000),
        (0.0f64..30.0, 0.0f64..0.05, 0.0f64..1e-3, 0u32..2_000),
    )
        .prop_map(
            |(
                (itl, iteration, ttft),
                (per_token, attention, chunk),
                (step, per_stream, kv, horizon),
            )| {
                ConditionalDisaggConfig {
                    slo_itl_ms: itl,
                    slo_ttft_ms: ttft,
                    prefill_iteration_ms: iteration,
                    prefill_ms_per_token: per_token,
                    prefill_attention_ms_per_token_pair: attention,
                    prefill_chunk_tokens: chunk,
                    decode_step_ms: step,
                    decode_step_ms_per_stream: per_stream,
                    kv_transfer_ms_per_token: kv,
                    itl_stall_horizon_tokens: horizon,
                    ..ConditionalDisaggConfig::default()
                }
            },
        )
}

proptest! {
    #[test]
    fn slo_cost_more_prefill_queue_never_turns_a_bypass_into_disagg(
        i in any_input(), cfg in any_timing(), more in 0u64..1_000_000
    ) {
        // A longer prefill queue only delays disagg.
        let busier = PolicyInput { prefill_queued_tokens: i.prefill_queued_tokens + more, ..i };
        if slo_cost::SloCost.decide(&i, &cfg).is_bypass() {
            prop_assert!(slo_cost::SloCost.decide(&busier, &cfg).is_bypass());
        }
    }

    #[test]
    fn slo_cost_a_larger_eff_isl_never_turns_disagg_into_bypass(
        i in any_input(), cfg in any_timing(), more in 0u32..=100
    ) {
        // More tokens to prefill locally (and fewer cached on the decode worker) only make a
        // bypass slower and its stall longer; disagg's cost does not depend on eff_isl.
        let larger = PolicyInput {
            eff_isl: i.eff_isl + (u64::from(i.isl - i.eff_isl) * u64::from(more) / 100) as u32,
            ..i
        };
        if !slo_cost::SloCost.decide(&i, &cfg).is_bypass() {
            prop_assert!(!slo_cost::SloCost.decide(&larger, &cfg).is_bypass());
        }
    }

    #[test]
    fn slo_cost_more_decode_queue_or_a_looser_itl_objective_move_the_right_way(
        i in any_input(), cfg in any_timing(), more in 0u64..100_000, looser in 0.0f64..50.0
    ) {
        let queued = PolicyInput { decode_queued_tokens: i.decode_queued_tokens + more, ..i };
        let loose = ConditionalDisaggConfig { slo_itl_ms: cfg.slo_itl_ms + looser, ..cfg };
        if !slo_cost::SloCost.decide(&i, &cfg).is_bypass() {
            prop_assert!(!slo_cost::SloCost.decide(&queued, &cfg).is_bypass());
        } else {
            prop_assert!(slo_cost::SloCost.decide(&i, &loose).is_bypass());
        }
    }

    #[test]
    fn slo_cost_bypasses_only_within_both_predictions(i in any_input(), cfg in any_timing()) {
        let p = slo_cost::predict(&i, &cfg);
        prop_assert!(p.bypass_ttft_ms.is_finite() && p.disagg_ttft_ms.is_finite());
        prop_assert!(p.rescue_budget_ms >= p.stall_budget_ms);
        if p.disagg_ttft_ms <= cfg.slo_ttft_ms || i.stall_rescue_scale <= 1.0 {
            prop_assert_eq!(p.rescue_budget_ms, p.stall_budget_ms);
        }
        let d = slo_cost::SloCost.decide(&i, &cfg);
        prop_assert_eq!(
            d.is_bypass(),
            p.bypass_ttft_ms <= p.disagg_ttft_ms && p.bypass_stall_ms <= p.rescue_budget_ms
        );
        // The rescue reason marks exactly the bypasses beyond the unrescued budget.
        prop_assert_eq!(
            d == Decision::Bypass(Reason::BypassSloCostRescue),
            d.is_bypass() && p.bypass_stall_ms > p.stall_budget_ms
        );
    }

    #[test]
    fn slo_cost_more_rescue_or_a_tighter_ttft_objective_never_turns_a_bypass_into_disagg(
        i in any_input(), cfg in any_timing(), more in 0.0f64..64.0, tighter in 0.0f64..=1.0
    ) {
        let rescued = PolicyInput { stall_rescue_scale: i.stall_rescue_scale + more, ..i };
        let tight = ConditionalDisaggConfig { slo_ttft_ms: (cfg.slo_ttft_ms * tighter).max(1e-3), ..cfg };
        if slo_cost::SloCost.decide(&i, &cfg).is_bypass() {
            prop_assert!(slo_cost::SloCost.decide(&rescued, &cfg).is_bypass());
            prop_assert!(slo_cost::SloCost.decide(&i, &tight).is_bypass());
        }
    }
}

proptest! {
    #[test]
    fn every_reason_is_registered_and_matches_its_mode(i in any_input(), cfg in any_config()) {
        let d = decide(&i, &cfg);
        prop_assert!(Reason::ALL.contains(&d.reason()));
        let mode = if d.is_bypass() { RouteMode::Bypass } else { RouteMode::Disagg };
        prop_assert_eq!(d.reason().mode(), Some(mode));
    }

    #[test]
    fn isl_or_load_bypasses_iff_either_rule_does(i in any_input(), cfg in any_config()) {
        let isl = isl_bounding::IslBounding.decide(&i, &cfg).is_bypass();
        let load = prefill_load::PrefillLoad.decide(&i, &cfg).is_bypass();
        prop_assert_eq!(isl_or_load::IslOrLoad.decide(&i, &cfg).is_bypass(), isl || load);
    }

    #[test]
    fn more_reuse_never_turns_a_bypass_into_disagg(i in any_input(), cfg in any_config(), less in 0u32..=100) {
        // isl_bounding is monotone: shrinking eff_isl keeps a bypass a bypass.
        let smaller = PolicyInput { eff_isl: (u64::from(i.eff_isl) * u64::from(less) / 100) as u32, ..i };
        if isl_bounding::IslBounding.decide(&i, &cfg).is_bypass() {
            prop_assert!(isl_bounding::IslBounding.decide(&smaller, &cfg).is_bypass());
        }
    }

    #[test]
    fn the_guard_only_vetoes(i in any_input(), cfg in any_config()) {
        let unguarded = ConditionalDisaggConfig { decode_busy_threshold: None, ..cfg };
        let with = decide(&i, &cfg);
        let without = decide(&i, &unguarded);
        if with.is_bypass() {
            prop_assert_eq!(with, without);
        }
        if !without.is_bypass() {
            prop_assert_eq!(with, without);
        }
        // A bypass that survives the guard fits under the threshold.
        if let (true, Some(t)) = (with.is_bypass(), cfg.decode_busy_threshold) {
            prop_assert!(i.decode_capacity_blocks > 0);
            prop_assert!(i.decode_projected_blocks as f64 <= t * i.decode_capacity_blocks as f64 + 1e-6);
        }
    }
}

proptest! {
    #[test]
    fn a_recorded_call_decides_the_same_after_a_json_round_trip(i in any_input(), cfg in any_config()) {
        // The status page's what-if reads recorded calls back from `/v1/status`'s JSON.
        let call = PolicyCall { input: i, config: cfg };
        let text = serde_json::to_string(&call).unwrap();
        let back: PolicyCall = serde_json::from_str(&text).unwrap();
        prop_assert_eq!(back, call);
        prop_assert_eq!(back.decide(), decide(&i, &cfg));
    }
}

#[test]
fn a_record_from_before_slo_cost_reads_with_its_new_inputs_zero() {
    let old = serde_json::json!({
        "isl": 100, "eff_isl": 10, "prefill_queued_tokens": 5,
        "decode_projected_blocks": 2, "decode_capacity_blocks": 1000
    });
    let back: PolicyInput = serde_json::from_value(old).unwrap();
    assert_eq!(
        back,
        PolicyInput {
            prefill_queued_tokens: 5,
            decode_projected_blocks: 2,
            decode_capacity_blocks: 1000,
            ..input(100, 10)
        }
    );
}

/// `into` with the field named `knob` taken from `from`.
fn with_knob(
    into: ConditionalDisaggConfig,
    from: &ConditionalDisaggConfig,
    knob: &str,
) -> ConditionalDisaggConfig {
    let mut c = into;
    match knob {
        "eff_isl_threshold" => c.eff_isl_threshold = from.eff_isl_threshold,
        "eff_isl_ratio_threshold" => c.eff_isl_ratio_threshold = from.eff_isl_ratio_threshold,
        "prefill_busy_threshold" => c.prefill_busy_threshold = from.prefill_busy_threshold,
        "prefill_queue_budget_tokens" => {
            c.prefill_queue_budget_tokens = from.prefill_queue_budget_tokens;
        }
        "decode_busy_threshold" => c.decode_busy_threshold = from.decode_busy_threshold,
        "slo_itl_ms" => c.slo_itl_ms = from.slo_itl_ms,
        "slo_ttft_ms" => c.slo_ttft_ms = from.slo_ttft_ms,
        "prefill_iteration_ms" => c.prefill_iteration_ms = from.prefill_iteration_ms,
        "prefill_ms_per_token" => c.prefill_ms_per_token = from.prefill_ms_per_token,
        "prefill_attention_ms_per_token_pair" => {
            c.prefill_attention_ms_per_token_pair = from.prefill_attention_ms_per_token_pair;
        }
        "prefill_chunk_tokens" => c.prefill_chunk_tokens = from.prefill_chunk_tokens,
        "decode_step_ms" => c.decode_step_ms = from.decode_step_ms,
        "decode_step_ms_per_stream" => {
            c.decode_step_ms_per_stream = from.decode_step_ms_per_stream;
        }
        "kv_transfer_ms_per_token" => c.kv_transfer_ms_per_token = from.kv_transfer_ms_per_token,
        "itl_stall_horizon_tokens" => c.itl_stall_horizon_tokens = from.itl_stall_horizon_tokens,
        other => panic!("no config field {other}"),
    }
    c
}

#[test]
fn every_knob_is_a_config_field_and_the_policy_names_match_json() {
    let json = serde_json::to_value(ConditionalDisaggConfig::default()).unwrap();
    for kind in PolicyKind::ALL {
        for knob in kind.knobs().iter().chain([&GUARD_KNOB]) {
            assert!(json.get(*knob).is_some(), "{knob}");
        }
        assert_eq!(serde_json::to_value(kind).unwrap(), kind.as_str());
    }
}

proptest! {
    #[test]
    fn fields_outside_a_rules_knobs_never_change_its_decisions(
        i in any_input(), cfg in any_config(), other in any_config()
    ) {
        // The what-if's sliders are a rule's knobs: anything else must be irrelevant to it.
        let mut mixed = ConditionalDisaggConfig { policy: cfg.policy, ..other };
        for knob in cfg.policy.knobs().iter().chain([&GUARD_KNOB]) {
            mixed = with_knob(mixed, &cfg, knob);
        }
        prop_assert_eq!(decide(&i, &mixed), decide(&i, &cfg));
    }
}
