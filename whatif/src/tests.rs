use serde_json::{json, Value};
use switchyard_policy::PolicyInput;

use super::*;

/// A recorded policy verdict for a prompt of `isl` tokens of which `eff_isl` uncached, decided
/// under the default config (as the control plane would have).
fn policy_record(id: &str, isl: u32, eff_isl: u32) -> Value {
    let call = PolicyCall {
        input: PolicyInput {
            isl,
            eff_isl,
            prefill_queued_tokens: 0,
            decode_projected_blocks: 10,
            decode_capacity_blocks: 1000,
            ..PolicyInput::default()
        },
        config: ConditionalDisaggConfig::default(),
    };
    let reason = call.decide().reason();
    json!({
        "at_ms": 5, "request_id": id, "model": null,
        "mode": reason.mode().map(RouteMode::as_str), "reason": reason,
        "decode": "decode-0", "prefill": null,
        "isl": isl, "cached_tokens": isl - eff_isl, "eff_isl": eff_isl,
        "policy": call,
    })
}

/// A verdict the serving mode gave.
fn agg_record(id: &str) -> Value {
    json!({
        "at_ms": 5, "request_id": id, "model": null, "mode": "agg",
        "reason": "agg:serving_mode", "decode": "decode-0", "prefill": null,
        "isl": 10, "cached_tokens": 0, "eff_isl": 10, "policy": null,
    })
}

fn answer(records: &[Value], config: Value) -> Value {
    let text = what_if_for_page(
        &Value::from(records.to_vec()).to_string(),
        &config.to_string(),
    );
    serde_json::from_str(&text).unwrap()
}

#[test]
fn the_recorded_config_gives_the_recorded_verdicts() {
    let records = [
        policy_record("warm", 4096, 10),
        policy_record("cold", 4096, 4096),
        agg_record("agg"),
    ];
    let a = &answer(&records, json!({}))["ok"];
    assert_eq!(a["total"], 3);
    assert_eq!(a["bypass"], 1);
    assert_eq!(a["recorded_bypass"], 1);
    assert_eq!(a["by_policy"], 2);
    assert_eq!(a["changed"], 0);
    assert_eq!(a["replay_mismatches"], 0);
    assert_eq!(
        a["reasons"],
        json!([
            {"reason": "bypass:isl_bounding", "count": 1},
            {"reason": "disagg:eff_isl_above_threshold", "count": 1},
            {"reason": "agg:serving_mode", "count": 1},
        ])
    );
    assert_eq!(a["verdicts"][2]["by_policy"], false);
}

#[test]
fn moving_a_threshold_redecides_only_the_policys_verdicts() {
    let records = [
        policy_record("warm", 4096, 10),
        policy_record("cold", 4096, 4096),
        policy_record("short", 100, 80),
        agg_record("agg"),
    ];
    // A threshold above the cold prompt and any ratio: everything the policy decided bypasses
    // except a ratio of exactly 1 (equality does not bypass).
    let a = &answer(
        &records,
        json!({"eff_isl_threshold": 5000, "eff_isl_ratio_threshold": 1.0}),
    )["ok"];
    let reasons: Vec<&str> = a["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["reason"].as_str().unwrap())
        .collect();
    assert_eq!(
        reasons,
        [
            "bypass:isl_bounding",
            "disagg:eff_isl_ratio_above_threshold",
            "bypass:isl_bounding",
            "agg:serving_mode",
        ]
    );
    assert_eq!(a["bypass"], 2);
    assert_eq!(a["recorded_bypass"], 1);
    assert_eq!(
        a["recorded_reasons"],
        json!([
            {"reason": "bypass:isl_bounding", "count": 1},
            {"reason": "disagg:eff_isl_above_threshold", "count": 1},
            {"reason": "disagg:eff_isl_ratio_above_threshold", "count": 1},
            {"reason": "agg:serving_mode", "count": 1},
        ])
    );
    assert_eq!(a["changed"], 2, "cold's reason and short's mode: {a}");
    // Another rule: prefill_load with an idle pool disaggregates everything it decides.
    let a = &answer(&records, json!({"policy": "prefill_load"}))["ok"];
    assert_eq!(a["bypass"], 0);
    assert_eq!(
        a["reasons"],
        json!([
            {"reason": "disagg:prefill_not_busy", "count": 3},
            {"reason": "agg:serving_mode", "count": 1},
        ])
    );
}

#[test]
fn the_guard_vetoes_in_the_what_if_too() {
    // The warm record's decode worker would hold 10 of 1000 blocks: above a 0.5 % guard.
    let a = &answer(
        &[policy_record("warm", 4096, 10)],
        json!({"decode_busy_threshold": 0.005}),
    )["ok"];
    assert_eq!(a["verdicts"][0]["reason"], "disagg:decode_busy");
    assert_eq!(a["bypass"], 0);
}

#[test]
fn a_record_that_does_not_replay_is_counted() {
    // As if the control plane's policy had bypassed what this code disaggregates.
    let mut record = policy_record("cold", 4096, 4096);
    record["mode"] = json!("bypass");
    record["reason"] = json!("bypass:isl_bounding");
    let a = &answer(&[record], json!({}))["ok"];
    assert_eq!(a["replay_mismatches"], 1);
    assert_eq!(a["changed"], 1);
}

#[test]
fn bad_input_is_an_error_answer_not_a_panic() {
    for (records, config, mentions) in [
        ("not json", "{}", "recorded verdicts"),
        ("[{\"request_id\": 1}]", "{}", "recorded verdicts"),
        ("[]", "[1]", "what-if config"),
        ("[]", "{\"eff_isl_threshold\": -1}", "what-if config"),
        (
            "[]",
            "{\"eff_isl_ratio_threshold\": 1.5}",
            "eff_isl_ratio_threshold",
        ),
        (
            "[]",
            "{\"prefill_queue_budget_tokens\": 0}",
            "prefill_queue_budget_tokens",
        ),
    ] {
        let answer: Value = serde_json::from_str(&what_if_for_page(records, config)).unwrap();
        let error = answer["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{answer}"));
        assert!(error.contains(mentions), "{error}");
    }
}

#[test]
fn an_unknown_reason_from_a_newer_control_plane_is_kept() {
    let mut record = agg_record("x");
    record["reason"] = json!("agg:something_new");
    let a = &answer(&[record], json!({}))["ok"];
    assert_eq!(a["verdicts"][0]["reason"], "unknown");
    assert_eq!(a["changed"], 0);
}

#[test]
fn the_knobs_are_each_rules_fields() {
    let knobs: Value = serde_json::from_str(&knobs_for_page()).unwrap();
    assert_eq!(
        knobs,
        json!({
            "isl_bounding": ["eff_isl_threshold", "eff_isl_ratio_threshold"],
            "prefill_load": ["prefill_busy_threshold", "prefill_queue_budget_tokens"],
            "isl_or_load": ["eff_isl_threshold", "eff_isl_ratio_threshold",
                            "prefill_busy_threshold", "prefill_queue_budget_tokens"],
            "slo_cost": ["slo_itl_ms", "slo_ttft_ms", "prefill_iteration_ms", "prefill_ms_per_token",
                         "prefill_attention_ms_per_token_pair", "prefill_chunk_tokens",
                         "decode_step_ms", "decode_step_ms_per_stream",
                         "kv_transfer_ms_per_token", "itl_stall_horizon_tokens"],
            "guard": "decode_busy_threshold",
        })
    );
}
