//! Envoy custom stats the filter keeps.
//!
//! Envoy shows wasm-defined counters under the `wasmcustom.` prefix in its admin `/stats`
//! (e.g. `wasmcustom.switchyard.fail_open.timeout: 3`). One counter per reason and per mode
//! keeps the set fixed and small; the status code of `bad_status_<code>` goes only into the
//! response header and the log.

use switchyard_protocol::route::RouteMode;

use crate::verdict::{FailOpenReason, RouteOutcome};

/// Every request that failed open, whatever the reason.
pub const FAIL_OPEN_TOTAL: &str = "switchyard.fail_open_total";
/// Every routed API request the filter asked the control plane about.
pub const ROUTE_CALLS_TOTAL: &str = "switchyard.route_calls_total";
/// Client-supplied routing headers removed.
pub const STRIPPED_HEADERS_TOTAL: &str = "switchyard.stripped_headers_total";

/// Modes in stat order.
pub const MODES: [RouteMode; 3] = [RouteMode::Bypass, RouteMode::Disagg, RouteMode::Agg];

/// Name of the per-reason fail-open counter.
pub fn fail_open_stat_name(stat_key: &str) -> String {
    format!("switchyard.fail_open.{stat_key}")
}

/// Name of the per-mode routed counter.
pub fn routed_stat_name(mode: RouteMode) -> String {
    format!("switchyard.routed.{}", mode.as_str())
}

/// Metric ids handed out by Envoy, indexed like [`FailOpenReason::STAT_KEYS`] and [`MODES`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatIds {
    /// Id of [`FAIL_OPEN_TOTAL`].
    pub fail_open_total: u32,
    /// Ids of the per-reason counters, in [`FailOpenReason::STAT_KEYS`] order.
    pub fail_open: Vec<u32>,
    /// Ids of the per-mode counters, in [`MODES`] order.
    pub routed: Vec<u32>,
    /// Id of [`ROUTE_CALLS_TOTAL`].
    pub route_calls_total: u32,
    /// Id of [`STRIPPED_HEADERS_TOTAL`].
    pub stripped_headers_total: u32,
}

impl StatIds {
    /// The counters to increment by one for an outcome.
    pub fn for_outcome(&self, outcome: &RouteOutcome) -> Vec<u32> {
        match outcome {
            RouteOutcome::Routed { mode, .. } => {
                let index = MODES.iter().position(|m| m == mode);
                index
                    .and_then(|i| self.routed.get(i))
                    .copied()
                    .into_iter()
                    .collect()
            }
            RouteOutcome::FailOpen(reason) => {
                let mut ids = vec![self.fail_open_total];
                let key = reason.stat_key();
                let index = FailOpenReason::STAT_KEYS.iter().position(|k| *k == key);
                ids.extend(index.and_then(|i| self.fail_open.get(i)).copied());
                ids
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> StatIds {
        StatIds {
            fail_open_total: 1,
            fail_open: (10..16).collect(),
            routed: vec![20, 21, 22],
            route_calls_total: 2,
            stripped_headers_total: 3,
        }
    }

    #[test]
    fn fail_open_counts_the_total_and_its_reason() {
        let outcome = RouteOutcome::FailOpen(FailOpenReason::Timeout);
        assert_eq!(ids().for_outcome(&outcome), vec![1, 11]);
        let outcome = RouteOutcome::FailOpen(FailOpenReason::BadStatus(500));
        assert_eq!(ids().for_outcome(&outcome), vec![1, 12]);
    }

    #[test]
    fn routed_counts_its_mode() {
        let outcome = RouteOutcome::Routed {
            mode: RouteMode::Agg,
            destination: "a:1".into(),
        };
        assert_eq!(ids().for_outcome(&outcome), vec![22]);
    }

    #[test]
    fn undefined_ids_are_skipped_not_panicked_on() {
        let outcome = RouteOutcome::FailOpen(FailOpenReason::EmptyBody);
        assert_eq!(StatIds::default().for_outcome(&outcome), vec![0]);
    }

    #[test]
    fn names() {
        assert_eq!(
            fail_open_stat_name("timeout"),
            "switchyard.fail_open.timeout"
        );
        assert_eq!(
            routed_stat_name(RouteMode::Bypass),
            "switchyard.routed.bypass"
        );
    }
}
