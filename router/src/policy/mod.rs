//! Conditional-disaggregation policies: given a request's chosen decode (and prefill)
//! worker, bypass the prefill pool or not. docs/policies.md, "Decision logic", is the contract;
//! `docs/policies.md` explains the rules, defaults and reasons.
//!
//! A policy is a synchronous, pure [`BypassPolicy`]: numbers in, [`Decision`] out, one file
//! per rule. [`decide`] picks the configured rule and then applies the decode-busy guard
//! ([`decode_busy`]), which can veto a bypass but never forces one.

pub mod decode_busy;
pub mod isl_bounding;
pub mod isl_or_load;
pub mod prefill_load;

#[cfg(test)]
mod tests;

use crate::config::{ConditionalDisaggConfig, PolicyKind};

/// Reason: bypassed because the uncached prompt is short (`isl_bounding`).
pub const BYPASS_ISL_BOUNDING: &str = "bypass:isl_bounding";
/// Reason: bypassed because the prefill worker is busy (`prefill_load`).
pub const BYPASS_PREFILL_BUSY: &str = "bypass:prefill_busy";
/// Reason: bypassed because the client asked for several choices (`n > 1`), which the KV
/// handoffs cannot carry.
pub const BYPASS_MULTIPLE_CHOICES: &str = "bypass:multiple_choices";
/// Reason: disaggregated because `eff_isl >= eff_isl_threshold`.
pub const DISAGG_EFF_ISL_ABOVE_THRESHOLD: &str = "disagg:eff_isl_above_threshold";
/// Reason: disaggregated because `eff_isl / isl >= eff_isl_ratio_threshold`.
pub const DISAGG_EFF_ISL_RATIO_ABOVE_THRESHOLD: &str = "disagg:eff_isl_ratio_above_threshold";
/// Reason: disaggregated because the prefill worker is not busy (`prefill_load`).
pub const DISAGG_PREFILL_NOT_BUSY: &str = "disagg:prefill_not_busy";
/// Reason: a bypass was vetoed because the decode worker would exceed its KV budget.
pub const DISAGG_DECODE_BUSY: &str = "disagg:decode_busy";
/// Reason: a bypass was vetoed because the decode worker reports no KV capacity.
pub const DISAGG_DECODE_CAPACITY_UNKNOWN: &str = "disagg:decode_capacity_unknown";

/// What a policy sees about one request and its chosen workers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicyInput {
    /// Prompt tokens.
    pub isl: u32,
    /// Prompt tokens the decode worker would have to prefill: `isl - min(cached, isl)`.
    pub eff_isl: u32,
    /// Prompt tokens queued for prefill on the chosen prefill worker (predicted).
    pub prefill_queued_tokens: u64,
    /// The decode worker's active KV blocks if it takes this request (predicted).
    pub decode_projected_blocks: u64,
    /// The decode worker's KV capacity in blocks (0: unknown).
    pub decode_capacity_blocks: u64,
}

/// Bypass or disaggregate, with the reason (one of [`crate::REASONS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Serve on the decode worker, prefilling there.
    Bypass(&'static str),
    /// Prefill on the prefill worker first.
    Disagg(&'static str),
}

impl Decision {
    /// The reason label.
    pub fn reason(self) -> &'static str {
        match self {
            Decision::Bypass(r) | Decision::Disagg(r) => r,
        }
    }

    /// Whether this is a bypass.
    pub fn is_bypass(self) -> bool {
        matches!(self, Decision::Bypass(_))
    }
}

/// One conditional-disaggregation rule.
pub trait BypassPolicy {
    /// Decides for one request. Pure: same input, same decision.
    fn decide(&self, input: &PolicyInput, cfg: &ConditionalDisaggConfig) -> Decision;
}

/// The configured rule, then the decode-busy guard.
pub fn decide(input: &PolicyInput, cfg: &ConditionalDisaggConfig) -> Decision {
    let decision = match cfg.policy {
        PolicyKind::IslBounding => isl_bounding::IslBounding.decide(input, cfg),
        PolicyKind::PrefillLoad => prefill_load::PrefillLoad.decide(input, cfg),
        PolicyKind::IslOrLoad => isl_or_load::IslOrLoad.decide(input, cfg),
    };
    match decision {
        Decision::Bypass(_) => decode_busy::veto(input, cfg).unwrap_or(decision),
        Decision::Disagg(_) => decision,
    }
}

/// Reason: `disagg` serving mode, every request is disaggregated.
pub const DISAGG_ALWAYS: &str = "disagg:always";
/// Reason: `agg` serving mode, no prefill pool.
pub const AGG_SERVING_MODE: &str = "agg:serving_mode";
/// Reason: disagg or conditional mode, but no live prefill worker: served aggregated.
pub const AGG_NO_PREFILL_WORKERS: &str = "agg:no_prefill_workers";

/// Every reason a verdict can carry (a closed set: metrics pre-register these labels).
pub const REASONS: &[&str] = &[
    BYPASS_ISL_BOUNDING,
    BYPASS_PREFILL_BUSY,
    BYPASS_MULTIPLE_CHOICES,
    DISAGG_EFF_ISL_ABOVE_THRESHOLD,
    DISAGG_EFF_ISL_RATIO_ABOVE_THRESHOLD,
    DISAGG_PREFILL_NOT_BUSY,
    DISAGG_DECODE_BUSY,
    DISAGG_DECODE_CAPACITY_UNKNOWN,
    DISAGG_ALWAYS,
    AGG_SERVING_MODE,
    AGG_NO_PREFILL_WORKERS,
];
