//! The decode-busy guard (`decode_busy_threshold`): a bypass puts the whole prefill on the
//! decode worker, stalling every stream it decodes, and its KV blocks must fit. So no bypass
//! when the decode worker's projected active KV blocks (its active blocks plus this
//! request's, see [`crate::load`]) would exceed `decode_busy_threshold × capacity`
//! (strictly: exactly at the limit still bypasses), and none when the worker reports no
//! capacity (0), since then nothing bounds it. The guard is off when the threshold is unset.

use crate::config::ConditionalDisaggConfig;
use crate::{Decision, PolicyInput, Reason};

/// The disagg decision that vetoes a bypass, if the guard fires.
pub fn veto(input: &PolicyInput, cfg: &ConditionalDisaggConfig) -> Option<Decision> {
    let threshold = cfg.decode_busy_threshold?;
    if input.decode_capacity_blocks == 0 {
        return Some(Decision::Disagg(Reason::DisaggDecodeCapacityUnknown));
    }
    let used = input.decode_projected_blocks as f64 / input.decode_capacity_blocks as f64;
    (used > threshold).then_some(Decision::Disagg(Reason::DisaggDecodeBusy))
}

/// Whether a worker whose active KV blocks would be `projected` with this request, out of
/// `capacity`, can take it: within its capacity and, with the guard on (`threshold`), within
/// that fraction of it (strictly above vetoes, as [`veto`]). A worker that reports no capacity
/// (0) is not known to be full, so it can. The router asks this of every decode worker before
/// sending a request to a full decode pool: when none can, the prefill worker keeps the request
/// and decodes it itself (`agg:decode_pool_full`, docs/policies.md).
pub fn can_take(projected: u64, capacity: u64, threshold: Option<f64>) -> bool {
    if capacity == 0 {
        return true;
    }
    let limit = threshold.map_or(1.0, |t| t.min(1.0));
    projected as f64 / capacity as f64 <= limit
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::input;

    fn veto_at(projected: u64, capacity: u64, threshold: Option<f64>) -> Option<Decision> {
        let cfg = ConditionalDisaggConfig {
            decode_busy_threshold: threshold,
            ..ConditionalDisaggConfig::default()
        };
        let mut i = input(100, 0);
        i.decode_projected_blocks = projected;
        i.decode_capacity_blocks = capacity;
        veto(&i, &cfg)
    }

    #[test]
    fn capacity_fraction_boundary() {
        assert_eq!(veto_at(899, 1000, Some(0.9)), None);
        assert_eq!(veto_at(900, 1000, Some(0.9)), None);
        assert_eq!(
            veto_at(901, 1000, Some(0.9)),
            Some(Decision::Disagg(Reason::DisaggDecodeBusy))
        );
    }

    #[test]
    fn unknown_capacity_vetoes_only_when_the_guard_is_on() {
        assert_eq!(
            veto_at(0, 0, Some(0.9)),
            Some(Decision::Disagg(Reason::DisaggDecodeCapacityUnknown))
        );
        assert_eq!(veto_at(10_000, 0, None), None);
        assert_eq!(veto_at(10_000, 1, None), None);
    }

    #[test]
    fn a_worker_can_take_a_request_within_its_capacity_and_the_guard() {
        assert!(can_take(1000, 1000, None));
        assert!(!can_take(1001, 1000, None));
        assert!(can_take(900, 1000, Some(0.9)));
        assert!(!can_take(901, 1000, Some(0.9)));
        // A guard above 1 does not let a worker take more than it holds.
        assert!(!can_take(1001, 1000, Some(1.5)));
        // Unknown capacity: nothing says it is full.
        assert!(can_take(u64::MAX, 0, Some(0.0)));
    }

    #[test]
    fn zero_threshold_allows_only_an_idle_worker() {
        assert_eq!(veto_at(0, 1000, Some(0.0)), None);
        assert_eq!(
            veto_at(1, 1000, Some(0.0)),
            Some(Decision::Disagg(Reason::DisaggDecodeBusy))
        );
    }
}
