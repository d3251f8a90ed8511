//! `isl_or_load`: bypass iff `isl_bounding` would bypass **or** the prefill worker is busy
//! (`prefill_load`). The reason names the rule that fired, `isl_bounding` first; when neither
//! fires it is `isl_bounding`'s disagg reason (why the prompt was too long to keep local).

use crate::config::ConditionalDisaggConfig;
use crate::isl_bounding::IslBounding;
use crate::prefill_load::is_busy;
use crate::{BypassPolicy, Decision, PolicyInput, Reason};

/// See the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub struct IslOrLoad;

impl BypassPolicy for IslOrLoad {
    fn decide(&self, input: &PolicyInput, cfg: &ConditionalDisaggConfig) -> Decision {
        match IslBounding.decide(input, cfg) {
            bypass @ Decision::Bypass(_) => bypass,
            disagg if !is_busy(input, cfg) => disagg,
            Decision::Disagg(_) => Decision::Bypass(Reason::BypassPrefillBusy),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::input;
    use crate::Reason;

    fn decide(eff_isl: u32, queued: u64) -> Decision {
        let cfg = ConditionalDisaggConfig {
            prefill_queue_budget_tokens: 1000,
            ..ConditionalDisaggConfig::default()
        };
        let mut i = input(100_000, eff_isl);
        i.prefill_queued_tokens = queued;
        IslOrLoad.decide(&i, &cfg)
    }

    #[test]
    fn either_rule_bypasses() {
        assert_eq!(decide(2047, 0), Decision::Bypass(Reason::BypassIslBounding));
        assert_eq!(
            decide(2047, 5000),
            Decision::Bypass(Reason::BypassIslBounding)
        );
        assert_eq!(
            decide(2048, 801),
            Decision::Bypass(Reason::BypassPrefillBusy)
        );
        assert_eq!(
            decide(2048, 800),
            Decision::Disagg(Reason::DisaggEffIslAboveThreshold)
        );
    }
}
