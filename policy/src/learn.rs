//! Learning `slo_cost`'s timing model online: two correction factors, one on the prefill
//! coefficients and one on the decode step, estimated from what requests actually took; and
//! the rescue factor on its stall budget, from how streams fared against the ITL objective
//! (below).
//!
//! The configured coefficients (the preset's, `ConditionalDisaggConfig`) may be off: another
//! GPU, another parallelism, a model the fit never saw. Each finished observation compares a
//! prediction made at routing time, under the configured coefficients, with what the
//! lifecycle reports showed:
//!
//! - **prefill**: the TTFT the router predicted for the path it chose, split into the part the
//!   prefill coefficients scale (`scaled_ms`: the prefill itself, and the queue ahead of it) and
//!   the rest (`fixed_ms`: KV transfer, decode steps), against the observed TTFT (route to
//!   `first_token`). The sample says `observed − fixed ≈ scale × scaled`.
//! - **decode**: the decode step the router predicts for the stream's worker, against the
//!   stream's observed mean time per output token (`first_token` to `done`, per token).
//!
//! Each factor is an exponentially weighted ratio of sums, `Σ w·observed / Σ w·predicted`
//! (weight `1 − decay` for the newest sample, older ones decaying geometrically): long
//! requests, whose timing decides bypasses, weigh the most, and a zero or tiny prediction
//! (a 1 ms prefill, quantised to whole milliseconds) cannot blow the ratio up. Factors stay
//! within [`MIN_SCALE`, `MAX_SCALE`] and start at 1 (the configured model) until
//! [`MIN_SAMPLES`] samples arrived.
//!
//! **Bounded by the SLOs.** A stream's observed time per token includes the stalls bypasses put
//! on it, so a learned decode step can grow past the ITL objective; then `slo_cost` would see
//! no slack and never bypass next to a running stream, or — were the factor not bounded —
//! drift further with every disagg it causes. The learned step is therefore capped at
//! [`STEP_SLO_SHARE`] of `slo_itl_ms`: a worker slower than that cannot meet the objective
//! whatever the policy does, and the policy keeps a slack to split between streams.
//!
//! **The rescue factor** (`RescueScale`) is learned from the same `done` reports, but against
//! the ITL objective itself rather than a prediction. `slo_cost` multiplies a stall budget by
//! it only for requests that disaggregation would bring to the first token after the TTFT
//! objective (lost that way; see `slo_cost.rs`). It is a quantile tracker: each finished
//! stream moves the factor's logarithm up by `RESCUE_STEP · RESCUE_MISS_SHARE` when it met the
//! ITL objective and down by `RESCUE_STEP · (1 − RESCUE_MISS_SHARE)` when it missed, so it
//! settles where [`RESCUE_MISS_SHARE`] of the streams miss: while streams have slack the rescue
//! grows, and as soon as its bypasses break more streams than that it shrinks back towards 1
//! (no rescue). Bounded to [1, [`RESCUE_MAX`]].
//!
//! Pure and deterministic: the router feeds it; the same code runs behind the control plane
//! and in the virtual-time replay.

use serde::{Deserialize, Serialize};

use crate::config::ConditionalDisaggConfig;

/// Smallest factor learned (the model 4× too slow).
pub const MIN_SCALE: f64 = 0.25;
/// Largest factor learned (the model 4× too fast).
pub const MAX_SCALE: f64 = 4.0;
/// Samples a factor needs before it replaces 1.
pub const MIN_SAMPLES: u64 = 8;
/// The learned decode step (with no stream counted) stays below this share of the ITL
/// objective.
pub const STEP_SLO_SHARE: f64 = 0.8;
/// Weight the past keeps per sample: about the last 1 / (1 − decay) = 50 samples count.
pub const DECAY: f64 = 0.98;
/// Share of finished streams missing the ITL objective at which the rescue factor stops
/// moving. 5 %: goodput loses those streams, but a request the rescue does not bypass is lost
/// for TTFT anyway (10 % did as well in virtual time, docs/benchmarks.md).
pub const RESCUE_MISS_SHARE: f64 = 0.05;
/// Step of the rescue factor's natural logarithm per finished stream: from 1 to its bound in
/// about 830 streams that all meet the objective, back in about 45 that miss it. In virtual
/// time 0.05 did as well on long saturated runs but climbed too slowly for a 1,500-request
/// overload (docs/benchmarks.md); 0.2 cost some light-load points.
pub const RESCUE_STEP: f64 = 0.1;
/// Largest rescue factor (a budget 64 times the `1/B` share).
pub const RESCUE_MAX: f64 = 64.0;

/// One exponentially weighted ratio `Σ w·observed / Σ w·predicted`.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Ratio {
    observed: f64,
    predicted: f64,
    samples: u64,
}

impl Ratio {
    /// Adds one sample; non-finite or negative values, and an empty prediction, are ignored.
    pub fn observe(&mut self, predicted: f64, observed: f64) {
        if !(predicted.is_finite() && observed.is_finite() && predicted > 0.0 && observed >= 0.0) {
            return;
        }
        self.observed = DECAY * self.observed + (1.0 - DECAY) * observed;
        self.predicted = DECAY * self.predicted + (1.0 - DECAY) * predicted;
        self.samples += 1;
    }

    /// The factor: 1 until [`MIN_SAMPLES`] samples, then the ratio within the bounds.
    pub fn scale(&self) -> f64 {
        if self.samples < MIN_SAMPLES || self.predicted <= 0.0 {
            1.0
        } else {
            (self.observed / self.predicted).clamp(MIN_SCALE, MAX_SCALE)
        }
    }

    /// Samples so far.
    pub fn samples(&self) -> u64 {
        self.samples
    }
}

/// `slo_cost`'s rescue factor: a quantile tracker over finished streams' ITL (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct RescueScale {
    /// Natural logarithm of the factor, in [0, ln `RESCUE_MAX`].
    log: f64,
    samples: u64,
}

impl RescueScale {
    /// One finished stream's mean time per output token against the ITL objective; non-finite
    /// values are ignored.
    pub fn observe(&mut self, itl_ms: f64, slo_itl_ms: f64) {
        if !(itl_ms.is_finite() && slo_itl_ms.is_finite()) {
            return;
        }
        let step = if itl_ms > slo_itl_ms {
            -RESCUE_STEP * (1.0 - RESCUE_MISS_SHARE)
        } else {
            RESCUE_STEP * RESCUE_MISS_SHARE
        };
        self.log = (self.log + step).clamp(0.0, RESCUE_MAX.ln());
        self.samples += 1;
    }

    /// The factor, in [1, [`RESCUE_MAX`]].
    pub fn scale(&self) -> f64 {
        self.log.exp()
    }

    /// Streams observed so far.
    pub fn samples(&self) -> u64 {
        self.samples
    }
}

/// The learned factors.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct TimingScales {
    /// On the prefill coefficients (`prefill_iteration_ms`, `prefill_ms_per_token`,
    /// `prefill_attention_ms_per_token_pair`).
    pub prefill: Ratio,
    /// On the decode step (`decode_step_ms`, `decode_step_ms_per_stream`).
    pub decode: Ratio,
    /// On the stall budget of requests that disaggregation would lose for TTFT.
    #[serde(default)]
    pub rescue: RescueScale,
}

impl TimingScales {
    /// A TTFT observation: the router predicted `fixed_ms + scaled_ms` under the configured
    /// coefficients, `observed_ms` passed.
    pub fn observe_ttft(&mut self, scaled_ms: f64, fixed_ms: f64, observed_ms: f64) {
        self.prefill
            .observe(scaled_ms, (observed_ms - fixed_ms).max(0.0));
    }

    /// A stream's mean time per output token, against the configured model's step for it and
    /// against the ITL objective (the rescue factor).
    pub fn observe_itl(&mut self, predicted_step_ms: f64, observed_ms: f64, slo_itl_ms: f64) {
        self.decode.observe(predicted_step_ms, observed_ms);
        self.rescue.observe(observed_ms, slo_itl_ms);
    }

    /// `cfg` with its timing coefficients corrected by the learned factors, the decode step
    /// capped at [`STEP_SLO_SHARE`] of the ITL objective (see the module docs).
    pub fn apply(&self, cfg: &ConditionalDisaggConfig) -> ConditionalDisaggConfig {
        let p = self.prefill.scale();
        let mut d = self.decode.scale();
        let cap = STEP_SLO_SHARE * cfg.slo_itl_ms;
        if cfg.decode_step_ms * d > cap && cfg.decode_step_ms > 0.0 {
            // Only down to the configured step: the cap bounds what is learned, not the
            // configuration.
            d = (cap / cfg.decode_step_ms).max(1.0_f64.min(d));
        }
        ConditionalDisaggConfig {
            prefill_iteration_ms: cfg.prefill_iteration_ms * p,
            prefill_ms_per_token: cfg.prefill_ms_per_token * p,
            prefill_attention_ms_per_token_pair: cfg.prefill_attention_ms_per_token_pair * p,
            decode_step_ms: cfg.decode_step_ms * d,
            decode_step_ms_per_stream: cfg.decode_step_ms_per_stream * d,
            ..*cfg
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_twice_too_slow_is_corrected_to_the_observations() {
        let mut s = TimingScales::default();
        for i in 0..200 {
            let predicted = 100.0 + f64::from(i % 7) * 50.0;
            s.observe_ttft(predicted, 5.0, 5.0 + predicted / 2.0);
            s.observe_itl(20.0, 10.0, 25.0);
        }
        assert!((s.prefill.scale() - 0.5).abs() < 1e-9);
        assert!((s.decode.scale() - 0.5).abs() < 1e-9);
        let cfg = ConditionalDisaggConfig::default();
        let learned = s.apply(&cfg);
        assert!((learned.prefill_ms_per_token - cfg.prefill_ms_per_token / 2.0).abs() < 1e-12);
        assert!((learned.decode_step_ms - cfg.decode_step_ms / 2.0).abs() < 1e-9);
        assert_eq!(learned.slo_itl_ms, cfg.slo_itl_ms);
    }

    #[test]
    fn nothing_changes_before_enough_samples_and_bad_samples_are_ignored() {
        let mut s = TimingScales::default();
        for _ in 0..MIN_SAMPLES - 1 {
            s.observe_ttft(100.0, 0.0, 300.0);
        }
        s.observe_ttft(0.0, 0.0, 300.0);
        s.observe_ttft(f64::NAN, 0.0, 300.0);
        s.observe_itl(10.0, f64::INFINITY, 25.0);
        assert_eq!(s.prefill.scale(), 1.0);
        assert_eq!(s.prefill.samples(), MIN_SAMPLES - 1);
        assert_eq!(s.decode.samples(), 0);
        let cfg = ConditionalDisaggConfig::default();
        assert_eq!(s.apply(&cfg), cfg);
    }

    #[test]
    fn factors_stay_within_bounds_and_the_step_below_the_objective() {
        let mut s = TimingScales::default();
        for _ in 0..100 {
            s.observe_ttft(10.0, 0.0, 10_000.0);
            s.observe_itl(16.0, 160.0, 25.0);
        }
        assert_eq!(s.prefill.scale(), MAX_SCALE);
        let cfg = ConditionalDisaggConfig::default();
        let learned = s.apply(&cfg);
        assert!((learned.decode_step_ms - STEP_SLO_SHARE * cfg.slo_itl_ms).abs() < 1e-9);
        // A configured step already above the cap is left as configured, not lowered.
        let slow = ConditionalDisaggConfig {
            decode_step_ms: 30.0,
            ..cfg
        };
        assert_eq!(s.apply(&slow).decode_step_ms, 30.0);
        // The fixed part is taken off; an observation below it counts as 0.
        let mut t = TimingScales::default();
        for _ in 0..100 {
            t.observe_ttft(100.0, 50.0, 20.0);
        }
        assert_eq!(t.prefill.scale(), MIN_SCALE);
    }

    #[test]
    fn the_rescue_factor_settles_where_its_share_of_streams_misses_the_objective() {
        let mut r = RescueScale::default();
        assert_eq!(r.scale(), 1.0);
        // Streams within the objective raise it, up to its bound and no further.
        for _ in 0..10_000 {
            r.observe(20.0, 25.0);
        }
        assert!((r.scale() - RESCUE_MAX).abs() < 1e-9);
        // Misses bring it back to 1 (no rescue), and never below.
        for _ in 0..1_000 {
            r.observe(30.0, 25.0);
        }
        assert_eq!(r.scale(), 1.0);
        // Exactly the target share of misses leaves it where it was: one miss in 20.
        for _ in 0..200 {
            r.observe(20.0, 25.0);
        }
        let before = r.scale();
        for _ in 0..50 {
            for _ in 0..19 {
                r.observe(20.0, 25.0);
            }
            r.observe(26.0, 25.0);
        }
        assert!(
            (r.scale() / before - 1.0).abs() < 1e-9,
            "{} {before}",
            r.scale()
        );
        // More misses than that lower it; non-finite observations are ignored.
        let n = r.samples();
        r.observe(f64::NAN, 25.0);
        assert_eq!(r.samples(), n);
        for _ in 0..10 {
            r.observe(26.0, 25.0);
        }
        assert!(r.scale() < before);
    }

    #[test]
    fn scales_from_before_the_rescue_factor_read_with_none() {
        let s = TimingScales::default();
        let mut json = serde_json::to_value(s).unwrap();
        json.as_object_mut().unwrap().remove("rescue");
        let back: TimingScales = serde_json::from_value(json).unwrap();
        assert_eq!(back.rescue.scale(), 1.0);
    }
}
