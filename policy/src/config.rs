//! The policy's configuration: which rule, and its thresholds, with their ranges.
//!
//! The router's config (`switchyard_router::config::RouterConfig`) holds this flat at its
//! JSON top level and re-exports these types; the ranges are checked here so that the
//! control plane and the status page's what-if refuse the same values.

use serde::{Deserialize, Serialize};

/// Which conditional-disaggregation rule decides bypass (see `docs/policies.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    /// Bypass iff the uncached part of the prompt is short in absolute and relative terms.
    #[default]
    IslBounding,
    /// Bypass iff the chosen prefill worker is busy.
    PrefillLoad,
    /// Bypass iff either of the above holds.
    IslOrLoad,
    /// Bypass iff each choice's predicted cost says so: a TTFT no worse than disagg's and a
    /// decode stall within the running streams' ITL budget (`slo_cost.rs`).
    SloCost,
}

impl PolicyKind {
    /// Every rule.
    pub const ALL: [PolicyKind; 4] = [
        PolicyKind::IslBounding,
        PolicyKind::PrefillLoad,
        PolicyKind::IslOrLoad,
        PolicyKind::SloCost,
    ];

    /// The JSON name.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::IslBounding => "isl_bounding",
            PolicyKind::PrefillLoad => "prefill_load",
            PolicyKind::IslOrLoad => "isl_or_load",
            PolicyKind::SloCost => "slo_cost",
        }
    }

    /// The config fields (JSON names) this rule reads; no other field changes its decisions
    /// except [`GUARD_KNOB`], which every rule is subject to. The status page offers exactly
    /// these as the what-if's sliders.
    pub fn knobs(self) -> &'static [&'static str] {
        const ISL: [&str; 2] = ["eff_isl_threshold", "eff_isl_ratio_threshold"];
        const LOAD: [&str; 2] = ["prefill_busy_threshold", "prefill_queue_budget_tokens"];
        const BOTH: [&str; 4] = [ISL[0], ISL[1], LOAD[0], LOAD[1]];
        match self {
            PolicyKind::IslBounding => &ISL,
            PolicyKind::PrefillLoad => &LOAD,
            PolicyKind::IslOrLoad => &BOTH,
            PolicyKind::SloCost => &SLO_COST_KNOBS,
        }
    }
}

/// The fields `slo_cost` reads: the SLOs and the timing model's coefficients.
pub const SLO_COST_KNOBS: [&str; 10] = [
    "slo_itl_ms",
    "slo_ttft_ms",
    "prefill_iteration_ms",
    "prefill_ms_per_token",
    "prefill_attention_ms_per_token_pair",
    "prefill_chunk_tokens",
    "decode_step_ms",
    "decode_step_ms_per_stream",
    "kv_transfer_ms_per_token",
    "itl_stall_horizon_tokens",
];

/// The decode-busy guard's field, read whatever the rule.
pub const GUARD_KNOB: &str = "decode_busy_threshold";

/// The conditional-disaggregation thresholds (docs/policies.md, "Decision logic").
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ConditionalDisaggConfig {
    /// The rule.
    pub policy: PolicyKind,
    /// `isl_bounding`: bypass needs `eff_isl < eff_isl_threshold` (tokens). Default 2048.
    pub eff_isl_threshold: u32,
    /// `isl_bounding`: bypass needs `eff_isl / isl < eff_isl_ratio_threshold`, in [0, 1].
    /// Default 0.7.
    pub eff_isl_ratio_threshold: f64,
    /// `prefill_load`: bypass iff the prefill worker's busyness (queued prefill tokens ÷
    /// `prefill_queue_budget_tokens`) is strictly above this. Default 0.8.
    pub prefill_busy_threshold: f64,
    /// The prefill queue (tokens) that counts as busyness 1.0. Default 32768, about 0.8 s of
    /// cold prefill on a GB200 TEP4 worker (docs/sim-model.md, "Prefill").
    pub prefill_queue_budget_tokens: u64,
    /// Guard: no bypass when the decode worker's projected active KV blocks would exceed
    /// this fraction of its capacity (and none when it reports no capacity). `None` (JSON
    /// `null`, the default) turns the guard off.
    pub decode_busy_threshold: Option<f64>,
    /// `slo_cost`: the ITL objective (ms), a stream's mean time per output token, as goodput
    /// counts it. Default 25.
    pub slo_itl_ms: f64,
    /// `slo_cost`: the TTFT objective (ms). A request that disaggregation would bring to its
    /// first token later than this is lost that way, so its bypass may use the learned rescue
    /// budget (`slo_cost.rs`). Default 2000.
    pub slo_ttft_ms: f64,
    /// `slo_cost`'s timing model: fixed cost of an iteration holding prefill work (ms), paid
    /// per chunk. Default 19.5 (GB200 FP8 TEP4's `a0`, docs/sim-model.md "Prefill").
    pub prefill_iteration_ms: f64,
    /// Prefill cost per new token (ms). Default 0.01489 (TEP4's `a1`, ~67k tokens/s).
    pub prefill_ms_per_token: f64,
    /// Prefill attention cost per new token per token it attends to (ms). Default 5.42e-7
    /// (TEP4's `a2`).
    pub prefill_attention_ms_per_token_pair: f64,
    /// Tokens prefilled per iteration (the engine's `max_num_batched_tokens`). Default 8192.
    pub prefill_chunk_tokens: u32,
    /// A decode iteration's fixed cost (ms) on a busy worker. Default 16.28 (TEP4's
    /// `b0 + b1`: every expert touched, the batch sizes where a stall matters).
    pub decode_step_ms: f64,
    /// A decode iteration's cost per running stream (ms). Default 0.0163 (TEP4's `b2`).
    pub decode_step_ms_per_stream: f64,
    /// KV transfer time per prompt token (ms). Default 3.82e-5: 96,256 B per FP8 token over
    /// 4 × 900 GB/s NVLink at 70 % (docs/sim-model.md, "KV transfer").
    pub kv_transfer_ms_per_token: f64,
    /// Output tokens a running stream still has to emit, over which a bypass's stall is
    /// spread (see `slo_cost.rs`). Default 256.
    pub itl_stall_horizon_tokens: u32,
}

impl Default for ConditionalDisaggConfig {
    fn default() -> Self {
        ConditionalDisaggConfig {
            policy: PolicyKind::IslBounding,
            eff_isl_threshold: 2048,
            eff_isl_ratio_threshold: 0.7,
            prefill_busy_threshold: 0.8,
            prefill_queue_budget_tokens: 32_768,
            decode_busy_threshold: None,
            slo_itl_ms: 25.0,
            slo_ttft_ms: 2000.0,
            prefill_iteration_ms: 19.5,
            prefill_ms_per_token: 0.01489,
            prefill_attention_ms_per_token_pair: 5.42e-7,
            prefill_chunk_tokens: 8192,
            decode_step_ms: 16.28,
            decode_step_ms_per_stream: 0.0163,
            kv_transfer_ms_per_token: 3.82e-5,
            itl_stall_horizon_tokens: 256,
        }
    }
}

impl ConditionalDisaggConfig {
    /// Checks every range.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first out-of-range field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let ratio = self.eff_isl_ratio_threshold;
        if !(ratio.is_finite() && (0.0..=1.0).contains(&ratio)) {
            return Err(ConfigError::new(
                "eff_isl_ratio_threshold",
                format!("must be in [0, 1], got {ratio}"),
            ));
        }
        non_negative("prefill_busy_threshold", self.prefill_busy_threshold)?;
        if let Some(t) = self.decode_busy_threshold {
            non_negative("decode_busy_threshold", t)?;
        }
        for (field, x) in [
            ("prefill_iteration_ms", self.prefill_iteration_ms),
            ("prefill_ms_per_token", self.prefill_ms_per_token),
            (
                "prefill_attention_ms_per_token_pair",
                self.prefill_attention_ms_per_token_pair,
            ),
            ("decode_step_ms", self.decode_step_ms),
            ("decode_step_ms_per_stream", self.decode_step_ms_per_stream),
            ("kv_transfer_ms_per_token", self.kv_transfer_ms_per_token),
        ] {
            non_negative(field, x)?;
        }
        for (field, x) in [
            ("slo_itl_ms", self.slo_itl_ms),
            ("slo_ttft_ms", self.slo_ttft_ms),
        ] {
            if !(x.is_finite() && x > 0.0) {
                return Err(ConfigError::new(
                    field,
                    format!("must be finite and positive, got {x}"),
                ));
            }
        }
        if self.prefill_chunk_tokens == 0 {
            return Err(ConfigError::new(
                "prefill_chunk_tokens",
                "must be at least 1",
            ));
        }
        if self.prefill_queue_budget_tokens == 0 {
            return Err(ConfigError::new(
                "prefill_queue_budget_tokens",
                "must be at least 1",
            ));
        }
        // 0 would give every stall budget 0: no `slo_cost` bypass beside any running stream.
        if self.itl_stall_horizon_tokens == 0 {
            return Err(ConfigError::new(
                "itl_stall_horizon_tokens",
                "must be at least 1",
            ));
        }
        Ok(())
    }
}

/// A config value was rejected; `field` is its JSON path (e.g. `selection.temperature`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid config field `{field}`: {message}")]
pub struct ConfigError {
    /// Dotted path of the offending field (`""` for the document itself).
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl ConfigError {
    /// The error for `field` (a dotted JSON path).
    pub fn new(field: &str, message: impl Into<String>) -> Self {
        ConfigError {
            field: field.to_string(),
            message: message.into(),
        }
    }
}

/// `Ok` iff `x` is finite and at least 0; else the error naming `field`.
///
/// # Errors
/// [`ConfigError`] for a negative, infinite or NaN value.
pub fn non_negative(field: &str, x: f64) -> Result<(), ConfigError> {
    if x.is_finite() && x >= 0.0 {
        Ok(())
    } else {
        Err(ConfigError::new(
            field,
            format!("must be finite and non-negative, got {x}"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid_and_each_range_names_its_field() {
        assert_eq!(ConditionalDisaggConfig::default().validate(), Ok(()));
        let field = |c: ConditionalDisaggConfig| c.validate().map_err(|e| e.field);
        let base = ConditionalDisaggConfig::default();
        for (bad, name) in [
            (
                ConditionalDisaggConfig {
                    eff_isl_ratio_threshold: 1.01,
                    ..base
                },
                "eff_isl_ratio_threshold",
            ),
            (
                ConditionalDisaggConfig {
                    eff_isl_ratio_threshold: f64::NAN,
                    ..base
                },
                "eff_isl_ratio_threshold",
            ),
            (
                ConditionalDisaggConfig {
                    prefill_busy_threshold: -0.1,
                    ..base
                },
                "prefill_busy_threshold",
            ),
            (
                ConditionalDisaggConfig {
                    decode_busy_threshold: Some(f64::INFINITY),
                    ..base
                },
                "decode_busy_threshold",
            ),
            (
                ConditionalDisaggConfig {
                    prefill_queue_budget_tokens: 0,
                    ..base
                },
                "prefill_queue_budget_tokens",
            ),
            (
                ConditionalDisaggConfig {
                    slo_itl_ms: 0.0,
                    ..base
                },
                "slo_itl_ms",
            ),
            (
                ConditionalDisaggConfig {
                    slo_itl_ms: f64::NAN,
                    ..base
                },
                "slo_itl_ms",
            ),
            (
                ConditionalDisaggConfig {
                    slo_ttft_ms: -1.0,
                    ..base
                },
                "slo_ttft_ms",
            ),
            (
                ConditionalDisaggConfig {
                    prefill_ms_per_token: -1e-3,
                    ..base
                },
                "prefill_ms_per_token",
            ),
            (
                ConditionalDisaggConfig {
                    kv_transfer_ms_per_token: f64::INFINITY,
                    ..base
                },
                "kv_transfer_ms_per_token",
            ),
            (
                ConditionalDisaggConfig {
                    prefill_chunk_tokens: 0,
                    ..base
                },
                "prefill_chunk_tokens",
            ),
        ] {
            assert_eq!(field(bad), Err(name.to_string()));
        }
    }
}
