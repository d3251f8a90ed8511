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
    }
}

fn any_input() -> impl Strategy<Value = PolicyInput> {
    (
        0u32..200_000,
        0u32..=100,
        0u64..100_000,
        0u64..20_000,
        0u64..20_000,
    )
        .prop_map(|(isl, pct, queued, projected, capacity)| PolicyInput {
            isl,
            eff_isl: (u64::from(isl) * u64::from(pct) / 100) as u32,
            prefill_queued_tokens: queued,
            decode_projected_blocks: projected,
            decode_capacity_blocks: capacity,
        })
}

fn any_config() -> impl Strategy<Value = ConditionalDisaggConfig> {
    (
        prop_oneof![
            Just(PolicyKind::IslBounding),
            Just(PolicyKind::PrefillLoad),
            Just(PolicyKind::IslOrLoad)
        ],
        0u32..10_000,
        0.0f64..=1.0,
        0.0f64..3.0,
        1u64..100_000,
        proptest::option::of(0.0f64..1.5),
    )
        .prop_map(
            |(policy, t, r, busy, budget, guard)| ConditionalDisaggConfig {
                policy,
                eff_isl_threshold: t,
                eff_isl_ratio_threshold: r,
                prefill_busy_threshold: busy,
                prefill_queue_budget_tokens: budget,
                decode_busy_threshold: guard,
            },
        )
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
