//! Conditional-disaggregation policies: given a request's chosen decode (and prefill)
//! worker, bypass the prefill pool or not. docs/policies.md, "Decision logic", is the contract;
//! `docs/policies.md` explains the rules, defaults and reasons.
//!
//! A policy is a synchronous, pure [`BypassPolicy`]: numbers in, [`Decision`] out, one file
//! per rule. [`decide`] picks the configured rule and then applies the decode-busy guard
//! ([`decode_busy`]), which can veto a bypass but never forces one.
//!
//! Its own crate, below the router, because two builds run this code: the router (natively,
//! re-exported as `switchyard_router::policy`) and the control plane's status page, which
//! re-decides recorded verdicts under other thresholds in the browser (`whatif/`, built for
//! `wasm32-unknown-unknown`, where the router's memory-mapped KV index does not build).
//! Dependencies: the protocol (for [`Reason`]), serde and thiserror only.
#![deny(missing_docs)]

pub mod config;
pub mod decode_busy;
pub mod isl_bounding;
pub mod isl_or_load;
pub mod learn;
pub mod prefill_load;
pub mod slo_cost;

#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

use crate::config::{ConditionalDisaggConfig, PolicyKind};

pub use switchyard_protocol::route::Reason;

/// What a policy sees about one request and its chosen workers. Serialized into the status
/// page's records, so that a verdict can be decided again under other thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
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
    /// Prompt tokens the chosen prefill worker caches (its leading blocks, capped at `isl`).
    /// `slo_cost` only; absent in records from before it, hence the serde default.
    #[serde(default)]
    pub prefill_cached_tokens: u32,
    /// Prompt tokens queued for prefill on the decode worker (predicted), before this request.
    #[serde(default)]
    pub decode_queued_tokens: u64,
    /// Streams decoding on the decode worker (routed there, past their first token, not
    /// done), before this request: the ones a local prefill stalls.
    #[serde(default)]
    pub decode_running_streams: u32,
    /// `slo_cost`'s learned rescue factor (`learn::RescueScale`) at the time: the stall budget's
    /// multiplier for a request that disaggregation would lose for TTFT. Values below 1 (0 in
    /// records from before it) mean no rescue.
    #[serde(default)]
    pub stall_rescue_scale: f64,
}

/// Bypass or disaggregate, with the reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Serve on the decode worker, prefilling there.
    Bypass(Reason),
    /// Prefill on the prefill worker first.
    Disagg(Reason),
}

impl Decision {
    /// The reason.
    pub fn reason(self) -> Reason {
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

/// One call of the policy: what it saw and the config in force, enough to make the decision
/// again ([`PolicyCall::decide`]) or to make it under another config ([`decide`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PolicyCall {
    /// What the policy saw.
    pub input: PolicyInput,
    /// The config it decided under.
    pub config: ConditionalDisaggConfig,
}

impl PolicyCall {
    /// The decision this call made.
    pub fn decide(&self) -> Decision {
        decide(&self.input, &self.config)
    }
}

/// The configured rule, then the decode-busy guard.
pub fn decide(input: &PolicyInput, cfg: &ConditionalDisaggConfig) -> Decision {
    let decision = match cfg.policy {
        PolicyKind::IslBounding => isl_bounding::IslBounding.decide(input, cfg),
        PolicyKind::PrefillLoad => prefill_load::PrefillLoad.decide(input, cfg),
        PolicyKind::IslOrLoad => isl_or_load::IslOrLoad.decide(input, cfg),
        PolicyKind::SloCost => slo_cost::SloCost.decide(input, cfg),
    };
    match decision {
        Decision::Bypass(_) => decode_busy::veto(input, cfg).unwrap_or(decision),
        Decision::Disagg(_) => decision,
    }
}
