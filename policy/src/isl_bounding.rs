//! `isl_bounding` (the default): bypass iff the uncached part of the prompt is short both in
//! tokens and as a share of the prompt, i.e. `eff_isl < eff_isl_threshold` **and**
//! `eff_isl / isl < eff_isl_ratio_threshold`. Equality does not bypass. An empty prompt
//! (`isl == 0`) has nothing to prefill and counts as ratio 0.
//!
//! Why both: a short absolute remainder keeps the decode worker's prefill stall small; the
//! ratio keeps a mostly cold prompt (little reuse, so the prefill pool would do real work)
//! off the decode worker even when it is short.

use crate::config::ConditionalDisaggConfig;
use crate::{BypassPolicy, Decision, PolicyInput, Reason};

/// See the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub struct IslBounding;

/// `eff_isl / isl`, 0 for an empty prompt. Division (not `ratio * isl`) so that a value
/// exactly at the threshold compares equal, as the user wrote it.
pub fn eff_isl_ratio(input: &PolicyInput) -> f64 {
    if input.isl == 0 {
        0.0
    } else {
        f64::from(input.eff_isl) / f64::from(input.isl)
    }
}

impl BypassPolicy for IslBounding {
    fn decide(&self, input: &PolicyInput, cfg: &ConditionalDisaggConfig) -> Decision {
        if input.eff_isl >= cfg.eff_isl_threshold {
            Decision::Disagg(Reason::DisaggEffIslAboveThreshold)
        } else if eff_isl_ratio(input) >= cfg.eff_isl_ratio_threshold {
            Decision::Disagg(Reason::DisaggEffIslRatioAboveThreshold)
        } else {
            Decision::Bypass(Reason::BypassIslBounding)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::input;

    fn decide(isl: u32, eff_isl: u32) -> Decision {
        IslBounding.decide(&input(isl, eff_isl), &ConditionalDisaggConfig::default())
    }

    #[test]
    fn absolute_threshold_boundary() {
        // Ratio well below 0.7 in all three: only the absolute bound matters.
        assert_eq!(
            decide(10_000, 2047),
            Decision::Bypass(Reason::BypassIslBounding)
        );
        assert_eq!(
            decide(10_000, 2048),
            Decision::Disagg(Reason::DisaggEffIslAboveThreshold)
        );
        assert_eq!(
            decide(10_000, 2049),
            Decision::Disagg(Reason::DisaggEffIslAboveThreshold)
        );
    }

    #[test]
    fn ratio_threshold_boundary() {
        assert_eq!(
            decide(1000, 699),
            Decision::Bypass(Reason::BypassIslBounding)
        );
        assert_eq!(
            decide(1000, 700),
            Decision::Disagg(Reason::DisaggEffIslRatioAboveThreshold)
        );
        assert_eq!(
            decide(10, 7),
            Decision::Disagg(Reason::DisaggEffIslRatioAboveThreshold)
        );
        assert_eq!(
            decide(1000, 701),
            Decision::Disagg(Reason::DisaggEffIslRatioAboveThreshold)
        );
    }

    #[test]
    fn cold_short_and_empty_prompts() {
        // Short but fully cold: the ratio (1.0) says disaggregate.
        assert_eq!(
            decide(100, 100),
            Decision::Disagg(Reason::DisaggEffIslRatioAboveThreshold)
        );
        assert_eq!(decide(0, 0), Decision::Bypass(Reason::BypassIslBounding));
        // Fully cached: nothing to prefill.
        assert_eq!(
            decide(50_000, 0),
            Decision::Bypass(Reason::BypassIslBounding)
        );
    }

    #[test]
    fn zero_thresholds_never_bypass_and_ratio_one_needs_some_reuse() {
        let cfg = ConditionalDisaggConfig {
            eff_isl_threshold: 0,
            ..ConditionalDisaggConfig::default()
        };
        assert!(!IslBounding.decide(&input(100, 0), &cfg).is_bypass());
        let mut cfg = ConditionalDisaggConfig {
            eff_isl_ratio_threshold: 0.0,
            ..ConditionalDisaggConfig::default()
        };
        assert!(!IslBounding.decide(&input(100, 0), &cfg).is_bypass());
        cfg.eff_isl_ratio_threshold = 1.0;
        assert!(IslBounding.decide(&input(100, 99), &cfg).is_bypass());
        assert!(!IslBounding.decide(&input(100, 100), &cfg).is_bypass());
    }
}
