//! `isl_or_load`: bypass iff `isl_bounding` would bypass **or** the prefill worker is busy
//! (`prefill_load`). The reason names the rule that fired, `isl_bounding` first; when neither
//! fires it is `isl_bounding`'s disagg reason (why the prompt was too long to keep local).

use super::isl_bounding::IslBounding;
use super::prefill_load::is_busy;
use super::{BypassPolicy, Decision, PolicyInput, BYPASS_PREFILL_BUSY};
use crate::config::ConditionalDisaggConfig;

/// See the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub struct IslOrLoad;

impl BypassPolicy for IslOrLoad {
    fn decide(&self, input: &PolicyInput, cfg: &ConditionalDisaggConfig) -> Decision {
        match IslBounding.decide(input, cfg) {
            bypass @ Decision::Bypass(_) => bypass,
            disagg if !is_busy(input, cfg) => disagg,
            Decision::Disagg(_) => Decision::Bypass(BYPASS_PREFILL_BUSY),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::tests::input;
    use crate::policy::{BYPASS_ISL_BOUNDING, DISAGG_EFF_ISL_ABOVE_THRESHOLD};

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
        assert_eq!(decide(2047, 0), Decision::Bypass(BYPASS_ISL_BOUNDING));
        assert_eq!(decide(2047, 5000), Decision::Bypass(BYPASS_ISL_BOUNDING));
        assert_eq!(decide(2048, 801), Decision::Bypass(BYPASS_PREFILL_BUSY));
        assert_eq!(
            decide(2048, 800),
            Decision::Disagg(DISAGG_EFF_ISL_ABOVE_THRESHOLD)
        );
    }
}
