use serde_json::json;

use super::*;

fn err(v: Value) -> ConfigError {
    RouterConfig::from_json(&v).expect_err("should be rejected")
}

#[test]
fn defaults_match_the_design() {
    let c = RouterConfig::default();
    assert_eq!(c.serving_mode, ServingMode::Conditional);
    assert_eq!(c.conditional.policy, PolicyKind::IslBounding);
    assert_eq!(c.conditional.eff_isl_threshold, 2048);
    assert_eq!(c.conditional.eff_isl_ratio_threshold, 0.7);
    assert_eq!(c.conditional.decode_busy_threshold, None);
    assert!(c.validate().is_ok());
}

#[test]
fn round_trips_through_json() {
    let mut c = RouterConfig::default();
    c.conditional.decode_busy_threshold = Some(0.9);
    c.selection.temperature = 0.5;
    let text = serde_json::to_string(&c).unwrap();
    let back: RouterConfig = serde_json::from_str(&text).unwrap();
    assert_eq!(back, c);
    // The conditional fields sit flat at the top level.
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["eff_isl_threshold"], json!(2048));
    assert_eq!(v["selection"]["temperature"], json!(0.5));
}

#[test]
fn a_patch_changes_only_what_it_names() {
    let base = RouterConfig::default();
    let next = base
        .apply_json_patch(&json!({"policy": "isl_or_load", "selection": {"temperature": 2.0}}))
        .unwrap();
    assert_eq!(next.conditional.policy, PolicyKind::IslOrLoad);
    assert_eq!(next.selection.temperature, 2.0);
    assert_eq!(next.selection.overlap_weight, 1.0);
    assert_eq!(next.conditional.eff_isl_threshold, 2048);
    // null resets the optional guard to off.
    let guarded = next
        .apply_json_patch(&json!({"decode_busy_threshold": 0.9}))
        .unwrap();
    assert_eq!(guarded.conditional.decode_busy_threshold, Some(0.9));
    let off = guarded
        .apply_json_patch(&json!({"decode_busy_threshold": null}))
        .unwrap();
    assert_eq!(off.conditional.decode_busy_threshold, None);
}

#[test]
fn unknown_fields_are_named() {
    let typo = err(json!({"polcy": "x"}));
    assert_eq!(typo.field, "polcy");
    // The keys a typo may have meant are listed.
    assert!(
        typo.message.contains("policy") && typo.message.contains("eff_isl_threshold"),
        "{}",
        typo.message
    );
    assert_eq!(
        err(json!({"selection": {"weight": 1}})).field,
        "selection.weight"
    );
    assert_eq!(err(json!({"load": {"ttl": 1}})).field, "load.ttl");
    assert_eq!(err(json!([1])).field, "");
    assert_eq!(err(json!({"selection": 3})).field, "selection");
}

#[test]
fn wrong_types_are_named() {
    assert_eq!(
        err(json!({"eff_isl_threshold": "big"})).field,
        "eff_isl_threshold"
    );
    assert_eq!(
        err(json!({"eff_isl_threshold": -1})).field,
        "eff_isl_threshold"
    );
    assert_eq!(
        err(json!({"eff_isl_threshold": 2048.5})).field,
        "eff_isl_threshold"
    );
    assert_eq!(err(json!({"policy": "random"})).field, "policy");
    assert_eq!(err(json!({"serving_mode": 1})).field, "serving_mode");
    assert_eq!(
        err(json!({"decode_busy_threshold": "0.9"})).field,
        "decode_busy_threshold"
    );
}

#[test]
fn ranges_are_enforced_at_their_boundaries() {
    for ok in [0.0, 0.5, 1.0] {
        assert!(RouterConfig::from_json(&json!({"eff_isl_ratio_threshold": ok})).is_ok());
    }
    for bad in [-0.01, 1.01] {
        assert_eq!(
            err(json!({"eff_isl_ratio_threshold": bad})).field,
            "eff_isl_ratio_threshold"
        );
    }
    assert!(RouterConfig::from_json(&json!({"prefill_busy_threshold": 0.0})).is_ok());
    assert_eq!(
        err(json!({"prefill_busy_threshold": -1.0})).field,
        "prefill_busy_threshold"
    );
    assert_eq!(
        err(json!({"decode_busy_threshold": -0.5})).field,
        "decode_busy_threshold"
    );
    assert_eq!(
        err(json!({"prefill_queue_budget_tokens": 0})).field,
        "prefill_queue_budget_tokens"
    );
    assert_eq!(
        err(json!({"itl_stall_horizon_tokens": 0})).field,
        "itl_stall_horizon_tokens"
    );
    assert_eq!(
        err(json!({"selection": {"temperature": -1}})).field,
        "selection.temperature"
    );
    assert_eq!(
        err(json!({"selection": {"overlap_weight": 1e308}})).field,
        "selection.overlap_weight"
    );
    assert!(RouterConfig::from_json(&json!({"selection": {"overlap_weight": 1e6}})).is_ok());
    assert_eq!(
        err(json!({"load": {"prefill_timeout_ms": 0}})).field,
        "load.prefill_timeout_ms"
    );
}

#[test]
fn non_finite_values_set_from_rust_are_rejected() {
    let mut c = RouterConfig::default();
    c.selection.overlap_weight = f64::NAN;
    assert_eq!(c.validate().unwrap_err().field, "selection.overlap_weight");
    let mut c = RouterConfig::default();
    c.conditional.eff_isl_ratio_threshold = f64::INFINITY;
    assert_eq!(c.validate().unwrap_err().field, "eff_isl_ratio_threshold");
}

#[test]
fn a_rejected_patch_leaves_the_config_untouched() {
    let base = RouterConfig::default();
    let before = base.clone();
    assert!(base
        .apply_json_patch(&json!({"policy": "prefill_load", "eff_isl_ratio_threshold": 3}))
        .is_err());
    assert_eq!(base, before);
}
