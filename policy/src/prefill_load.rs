//! `prefill_load`: bypass iff the chosen prefill worker is busy, so that work the prefill
//! pool cannot absorb promptly runs on the decode worker instead of queueing.
//!
//! **Busy** is defined as `busyness = queued prefill tokens / prefill_queue_budget_tokens`
//! on the chosen prefill worker (the cheapest one, so if it is busy all are), where queued
//! prefill tokens are the router's prediction corrected by the worker's load reports
//! ([`crate::load`]). Bypass iff `busyness > prefill_busy_threshold` (strictly: exactly at
//! the threshold does not bypass). With the defaults (budget 32 768 tokens, threshold 0.8)
//! the pool counts as busy once more than 26 214 tokens (~0.5 s of GB200 prefill) wait.

use crate::config::ConditionalDisaggConfig;
use crate::{BypassPolicy, Decision, PolicyInput, Reason};

/// See the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub struct PrefillLoad;

/// Busyness of the prefill worker (see the module docs); may exceed 1.
pub fn busyness(input: &PolicyInput, cfg: &ConditionalDisaggConfig) -> f64 {
    input.prefill_queued_tokens as f64 / cfg.prefill_queue_budget_tokens.max(1) as f64
}

/// Whether the prefill worker counts as busy.
pub fn is_busy(input: &PolicyInput, cfg: &ConditionalDisaggConfig) -> bool {
    busyness(input, cfg) > cfg.prefill_busy_threshold
}

impl BypassPolicy for PrefillLoad {
    fn decide(&self, input: &PolicyInput, cfg: &ConditionalDisaggConfig) -> Decision {
        if is_busy(input, cfg) {
            Decision::Bypass(Reason::BypassPrefillBusy)
        } else {
            Decision::Disagg(Reason::DisaggPrefillNotBusy)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::input;

    fn decide(queued: u64, threshold: f64) -> Decision {
        let cfg = ConditionalDisaggConfig {
            prefill_busy_threshold: threshold,
            prefill_queue_budget_tokens: 1000,
            ..ConditionalDisaggConfig::default()
        };
        let mut i = input(4096, 4096);
        i.prefill_queued_tokens = queued;
        PrefillLoad.decide(&i, &cfg)
    }

    #[test]
    fn busy_threshold_boundary() {
        assert_eq!(
            decide(799, 0.8),
            Decision::Disagg(Reason::DisaggPrefillNotBusy)
        );
        assert_eq!(
            decide(800, 0.8),
            Decision::Disagg(Reason::DisaggPrefillNotBusy)
        );
        assert_eq!(
            decide(801, 0.8),
            Decision::Bypass(Reason::BypassPrefillBusy)
        );
    }

    #[test]
    fn idle_pool_never_counts_as_busy_and_thresholds_above_one_allow_overload() {
        assert_eq!(
            decide(0, 0.0),
            Decision::Disagg(Reason::DisaggPrefillNotBusy)
        );
        assert_eq!(decide(1, 0.0), Decision::Bypass(Reason::BypassPrefillBusy));
        assert_eq!(
            decide(1500, 1.5),
            Decision::Disagg(Reason::DisaggPrefillNotBusy)
        );
        assert_eq!(
            decide(1501, 1.5),
            Decision::Bypass(Reason::BypassPrefillBusy)
        );
    }
}
