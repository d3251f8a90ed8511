//! The status page's what-if: "what would these recent verdicts have been under other
//! thresholds?", answered in the browser by the policy's own code.
//!
//! The control plane records, with each verdict its policy gave, what the policy saw and the
//! config in force ([`PolicyCall`], in `GET /v1/status`). This crate decides those calls again
//! under a config the operator sets with the page's sliders, through
//! [`switchyard_policy::decide`], the function the router calls, and counts the bypass share
//! and the reasons that result. Verdicts the policy did not give (the serving mode or the
//! request decided them) stay as recorded.
//!
//! Built for `wasm32-unknown-unknown` and bound to JavaScript with `wasm-bindgen`
//! (`scripts/build-whatif.sh`), the control plane serves it to the page; natively it is plain
//! Rust, tested here. The browser boundary is one function, [`what_if_for_page`], that takes
//! and returns JSON text, so that nothing at the boundary can throw: errors come back as
//! `{"error": "..."}`.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use switchyard_policy::config::{ConditionalDisaggConfig, ConfigError, PolicyKind, GUARD_KNOB};
use switchyard_policy::{decide, PolicyCall, Reason};
use switchyard_protocol::route::RouteMode;

#[cfg(target_arch = "wasm32")]
use wasm_bindgen::prelude::wasm_bindgen;

/// One recorded verdict, as `GET /v1/status` lists it in `decisions.recent` (the fields read
/// here; the others are ignored).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Recorded {
    /// The request's id.
    pub request_id: String,
    /// The recorded mode.
    pub mode: RouteMode,
    /// The recorded reason.
    pub reason: Reason,
    /// What the policy saw and the config in force; `None` when the policy did not decide.
    #[serde(default)]
    pub policy: Option<PolicyCall>,
}

/// A recorded verdict, decided again.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Redecided {
    /// The request's id.
    pub request_id: String,
    /// The mode under the what-if config.
    pub mode: RouteMode,
    /// The reason under the what-if config.
    pub reason: Reason,
    /// Whether the policy decided it (else it is kept as recorded).
    pub by_policy: bool,
    /// Whether the mode or the reason differs from the recorded one.
    pub changed: bool,
}

/// How many verdicts came out with one reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ReasonCount {
    /// The reason.
    pub reason: Reason,
    /// Verdicts with it.
    pub count: u64,
}

/// The what-if's answer for a list of recorded verdicts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WhatIf {
    /// Verdicts considered.
    pub total: u64,
    /// Of which bypassed under the what-if config.
    pub bypass: u64,
    /// Of which bypassed as recorded.
    pub recorded_bypass: u64,
    /// Verdicts the policy gave (the rest are kept as recorded).
    pub by_policy: u64,
    /// Verdicts whose mode or reason the what-if config changes.
    pub changed: u64,
    /// Policy verdicts whose recorded call, decided again under its own recorded config,
    /// does not give the recorded reason: 0 unless the page's policy code differs from the
    /// control plane's (an old module cached by the browser, say).
    pub replay_mismatches: u64,
    /// Verdicts per reason under the what-if config, in [`Reason`] order.
    pub reasons: Vec<ReasonCount>,
    /// Verdicts per reason as recorded, in [`Reason`] order.
    pub recorded_reasons: Vec<ReasonCount>,
    /// Every verdict, in the order given.
    pub verdicts: Vec<Redecided>,
}

/// Decides `records` again under `config` (see the crate docs).
pub fn what_if(records: &[Recorded], config: &ConditionalDisaggConfig) -> WhatIf {
    let mut answer = WhatIf {
        total: 0,
        bypass: 0,
        recorded_bypass: 0,
        by_policy: 0,
        changed: 0,
        replay_mismatches: 0,
        reasons: Vec::new(),
        recorded_reasons: Vec::new(),
        verdicts: Vec::with_capacity(records.len()),
    };
    let mut reasons = BTreeMap::new();
    let mut recorded_reasons = BTreeMap::new();
    for record in records {
        let (mode, reason) = match &record.policy {
            Some(call) => {
                answer.by_policy += 1;
                answer.replay_mismatches += u64::from(call.decide().reason() != record.reason);
                let decision = decide(&call.input, config);
                let mode = if decision.is_bypass() {
                    RouteMode::Bypass
                } else {
                    RouteMode::Disagg
                };
                (mode, decision.reason())
            }
            None => (record.mode, record.reason),
        };
        let changed = mode != record.mode || reason != record.reason;
        answer.total += 1;
        answer.bypass += u64::from(mode == RouteMode::Bypass);
        answer.recorded_bypass += u64::from(record.mode == RouteMode::Bypass);
        answer.changed += u64::from(changed);
        *reasons.entry(reason).or_insert(0u64) += 1;
        *recorded_reasons.entry(record.reason).or_insert(0u64) += 1;
        answer.verdicts.push(Redecided {
            request_id: record.request_id.clone(),
            mode,
            reason,
            by_policy: record.policy.is_some(),
            changed,
        });
    }
    answer.reasons = counts(reasons);
    answer.recorded_reasons = counts(recorded_reasons);
    answer
}

fn counts(by_reason: BTreeMap<Reason, u64>) -> Vec<ReasonCount> {
    by_reason
        .into_iter()
        .map(|(reason, count)| ReasonCount { reason, count })
        .collect()
}

/// Why the page's request could not be answered.
#[derive(Debug, thiserror::Error)]
pub enum WhatIfError {
    /// The records are not the JSON list `/v1/status` gives.
    #[error("the recorded verdicts are not readable: {0}")]
    Records(serde_json::Error),
    /// The config is not a JSON config object.
    #[error("the what-if config is not readable: {0}")]
    Config(serde_json::Error),
    /// The config has a value the control plane would refuse.
    #[error(transparent)]
    Invalid(#[from] ConfigError),
}

/// [`what_if`] on JSON text: `records` as `/v1/status`'s `decisions.recent`, `config` the
/// policy's fields as in `/v1/config` (absent ones take their defaults).
///
/// # Errors
/// [`WhatIfError`] for unreadable records or config, or a config out of range.
pub fn what_if_json(records: &str, config: &str) -> Result<WhatIf, WhatIfError> {
    let records: Vec<Recorded> = serde_json::from_str(records).map_err(WhatIfError::Records)?;
    let config: ConditionalDisaggConfig =
        serde_json::from_str(config).map_err(WhatIfError::Config)?;
    config.validate()?;
    Ok(what_if(&records, &config))
}

/// What the page gets back: the answer or the error's text.
#[derive(Serialize)]
#[serde(rename_all = "snake_case")]
enum PageAnswer {
    Ok(WhatIf),
    Error(String),
}

/// The page's entry point: [`what_if_json`] with the answer as JSON text, `{"ok": WhatIf}` or
/// `{"error": "message"}`; never throws into JavaScript.
#[cfg_attr(target_arch = "wasm32", wasm_bindgen)]
pub fn what_if_for_page(records: &str, config: &str) -> String {
    let answer = match what_if_json(records, config) {
        Ok(answer) => PageAnswer::Ok(answer),
        Err(e) => PageAnswer::Error(e.to_string()),
    };
    serde_json::to_string(&answer).unwrap_or_else(|e| error_json(&e.to_string()))
}

/// The sliders the page shows for each rule, as JSON: `{"isl_bounding": [field, ...], ...,
/// "guard": "decode_busy_threshold"}` ([`PolicyKind::knobs`]).
#[cfg_attr(target_arch = "wasm32", wasm_bindgen)]
pub fn knobs_for_page() -> String {
    let mut knobs = serde_json::Map::new();
    for kind in PolicyKind::ALL {
        knobs.insert(kind.as_str().to_string(), kind.knobs().into());
    }
    knobs.insert("guard".to_string(), GUARD_KNOB.into());
    serde_json::Value::Object(knobs).to_string()
}

/// `{"error": message}`, built without a serializer that could fail.
fn error_json(message: &str) -> String {
    serde_json::json!({ "error": message }).to_string()
}

#[cfg(test)]
mod tests;
