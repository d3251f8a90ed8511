//! Envoy custom stats the filter keeps.
//!
//! Envoy shows wasm-defined stats under the `wasmcustom.` prefix in its admin `/stats`
//! (e.g. `wasmcustom.switchyard.fail_open.timeout: 3`). One counter per reason and per mode
//! keeps the set fixed and small; the status code of `bad_status_<code>` goes only into the
//! response header and the log.

use switchyard_protocol::route::RouteMode;

use crate::outcome::{FallbackReason, Rejection};
use crate::tokenize::BodyFallback;
use crate::verdict::{FailOpenReason, RouteOutcome};

/// Every request that failed open, whatever the reason.
pub const FAIL_OPEN_TOTAL: &str = "switchyard.fail_open_total";
/// Every routed API request the filter asked the control plane about.
pub const ROUTE_CALLS_TOTAL: &str = "switchyard.route_calls_total";
/// Client-supplied routing headers removed.
pub const STRIPPED_HEADERS_TOTAL: &str = "switchyard.stripped_headers_total";
/// Requests the gateway refused, every reason (each has its own counter too).
pub const REJECTED_TOTAL: &str = "switchyard.rejected_total";
/// Client bodies that carried steering keys (`kv_transfer_params`, ...), which were removed.
pub const CLIENT_STEERING_STRIPPED_TOTAL: &str = "switchyard.client_steering_stripped_total";
/// Routed bodies screened after the route call, because the verdict did not vouch for them
/// (`Verdict::steering_free`) or none came. A body the verdict vouches for is not screened.
pub const DEFERRED_SCREENS_TOTAL: &str = "switchyard.deferred_screens_total";
/// Prefill holds released because their decode leg failed or never came.
pub const PREFILL_RELEASES_TOTAL: &str = "switchyard.prefill.releases_total";
/// Release calls that were refused or failed (a real vLLM has no release endpoint: its own
/// timeout frees the KV).
pub const PREFILL_RELEASE_FAILURES_TOTAL: &str = "switchyard.prefill.release_failures_total";
/// Prefill legs whose client left before they answered: proxy-wasm cannot cancel the call,
/// and its answer (which names the KV hold) reaches no context, so the prefill worker keeps
/// the KV until its own lease ends.
pub const PREFILL_ABANDONED_TOTAL: &str = "switchyard.prefill.abandoned_total";
/// Prefill-leg attempts dispatched (retries included).
pub const PREFILL_ATTEMPTS_TOTAL: &str = "switchyard.prefill.attempts_total";
/// Prefill-leg retries (502/503/504).
pub const PREFILL_RETRIES_TOTAL: &str = "switchyard.prefill.retries_total";
/// Prefill legs that failed (the request fell back to local prefill).
pub const PREFILL_FAILURES_TOTAL: &str = "switchyard.prefill.failures_total";
/// Prefill legs whose answer carried `kv_transfer_params` (handed to the decode worker).
pub const PREFILL_HANDOFFS_TOTAL: &str = "switchyard.prefill.handoffs_total";
/// Prefill legs answered 200 without `kv_transfer_params` (decode prefills locally).
pub const PREFILL_NO_HANDOFF_TOTAL: &str = "switchyard.prefill.no_kv_params_total";
/// Concurrent prefill legs (SGLang) that failed once the decode leg had been sent: the
/// client got a 502 (`x-switchyard-route: error;reason=prefill_failed`).
pub const PREFILL_LOST_TOTAL: &str = "switchyard.prefill.lost_total";
/// Requests Envoy served on another upstream than the destination the filter set (the
/// destination refused the connection, or is no host of its cluster): served, but not where
/// the verdict's cache affinity pointed. The response carries `x-switchyard-upstream`.
pub const REROUTED_TOTAL: &str = "switchyard.rerouted_total";
/// Histogram of a whole prefill leg (all attempts), milliseconds.
pub const PREFILL_LATENCY_MS: &str = "switchyard.prefill.latency_ms";
/// Lifecycle events sent to the control plane (accepted with 2xx).
pub const REPORTS_SENT_TOTAL: &str = "switchyard.lifecycle.reports_sent_total";
/// Lifecycle events dropped: queue full, or the control plane refused their POST.
pub const REPORTS_DROPPED_TOTAL: &str = "switchyard.lifecycle.reports_dropped_total";
/// Lifecycle events whose POST the control plane did not take (no answer, 502/503/504), put
/// back at the front of the queue to be sent again.
pub const REPORTS_REQUEUED_TOTAL: &str = "switchyard.lifecycle.reports_requeued_total";

/// Route calls that carried block hashes (the filter tokenized).
pub const ROUTE_INPUT_HASHES_TOTAL: &str = "switchyard.route_input.hashes_total";
/// Bytes of route-call bodies sent (body or hashed prompt).
pub const ROUTE_CALL_BYTES_TOTAL: &str = "switchyard.route_call_bytes_total";
/// Tokenizers loaded in a VM (`tokenize: filter`).
pub const TOKENIZER_LOADS_TOTAL: &str = "switchyard.tokenizer.loads_total";
/// Tokenizer fetches that failed (retried with backoff).
pub const TOKENIZER_LOAD_FAILURES_TOTAL: &str = "switchyard.tokenizer.load_failures_total";

/// Name of the per-reason counter of route calls that carried the body in `tokenize: filter`
/// mode.
pub fn route_input_body_stat_name(reason: BodyFallback) -> String {
    format!("switchyard.route_input.body.{}", reason.as_str())
}

/// Modes in stat order.
pub const MODES: [RouteMode; 3] = [RouteMode::Bypass, RouteMode::Disagg, RouteMode::Agg];

/// Name of the per-reason fail-open counter.
pub fn fail_open_stat_name(stat_key: &str) -> String {
    format!("switchyard.fail_open.{stat_key}")
}

/// Name of the per-mode verdict counter.
pub fn routed_stat_name(mode: RouteMode) -> String {
    format!("switchyard.routed.{}", mode.as_str())
}

/// Name of the per-reason rejection counter.
pub fn rejected_stat_name(stat_key: &str) -> String {
    format!("switchyard.rejected.{stat_key}")
}

/// Name of the per-reason fallback counter (mode label `fallback:<reason>`).
pub fn fallback_stat_name(reason: FallbackReason) -> String {
    format!("switchyard.fallback.{}", reason.as_str())
}

/// Metric ids handed out by Envoy. Id 0 means "not defined"; increments of it are skipped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatIds {
    /// Id of [`FAIL_OPEN_TOTAL`].
    pub fail_open_total: u32,
    /// Ids of the per-reason counters, in [`FailOpenReason::STAT_KEYS`] order.
    pub fail_open: Vec<u32>,
    /// Ids of the per-mode counters, in [`MODES`] order.
    pub routed: Vec<u32>,
    /// Ids of the per-reason fallback counters, in [`FallbackReason::STAT_KEYS`] order.
    pub fallback: Vec<u32>,
    /// Id of [`ROUTE_CALLS_TOTAL`].
    pub route_calls_total: u32,
    /// Id of [`STRIPPED_HEADERS_TOTAL`].
    pub stripped_headers_total: u32,
    /// Id of [`REJECTED_TOTAL`].
    pub rejected_total: u32,
    /// Ids of the per-reason rejection counters, in [`Rejection::STAT_KEYS`] order.
    pub rejected: Vec<u32>,
    /// Id of [`CLIENT_STEERING_STRIPPED_TOTAL`].
    pub client_steering_stripped_total: u32,
    /// Id of [`DEFERRED_SCREENS_TOTAL`].
    pub deferred_screens_total: u32,
    /// Id of [`PREFILL_RELEASES_TOTAL`].
    pub prefill_releases_total: u32,
    /// Id of [`PREFILL_RELEASE_FAILURES_TOTAL`].
    pub prefill_release_failures_total: u32,
    /// Id of [`PREFILL_ABANDONED_TOTAL`].
    pub prefill_abandoned_total: u32,
    /// Id of [`PREFILL_ATTEMPTS_TOTAL`].
    pub prefill_attempts_total: u32,
    /// Id of [`PREFILL_RETRIES_TOTAL`].
    pub prefill_retries_total: u32,
    /// Id of [`PREFILL_FAILURES_TOTAL`].
    pub prefill_failures_total: u32,
    /// Id of [`PREFILL_HANDOFFS_TOTAL`].
    pub prefill_handoffs_total: u32,
    /// Id of [`PREFILL_NO_HANDOFF_TOTAL`].
    pub prefill_no_handoff_total: u32,
    /// Id of [`PREFILL_LOST_TOTAL`].
    pub prefill_lost_total: u32,
    /// Id of [`REROUTED_TOTAL`].
    pub rerouted_total: u32,
    /// Id of the [`PREFILL_LATENCY_MS`] histogram.
    pub prefill_latency_ms: u32,
    /// Id of [`REPORTS_SENT_TOTAL`].
    pub reports_sent_total: u32,
    /// Id of [`REPORTS_DROPPED_TOTAL`].
    pub reports_dropped_total: u32,
    /// Id of [`REPORTS_REQUEUED_TOTAL`].
    pub reports_requeued_total: u32,
    /// Id of [`ROUTE_INPUT_HASHES_TOTAL`].
    pub route_input_hashes_total: u32,
    /// Ids of the per-reason body-fallback counters, in [`BodyFallback::ALL`] order.
    pub route_input_body: Vec<u32>,
    /// Id of [`ROUTE_CALL_BYTES_TOTAL`].
    pub route_call_bytes_total: u32,
    /// Id of [`TOKENIZER_LOADS_TOTAL`].
    pub tokenizer_loads_total: u32,
    /// Id of [`TOKENIZER_LOAD_FAILURES_TOTAL`].
    pub tokenizer_load_failures_total: u32,
}

impl StatIds {
    /// The counters to increment by one for a verdict (or its absence).
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
            RouteOutcome::Rejected { reason, .. } => {
                self.for_rejection(Rejection::ControlPlane(*reason))
            }
        }
    }

    /// The counters to increment by one for a refused request.
    pub fn for_rejection(&self, rejection: Rejection) -> Vec<u32> {
        let key = rejection.as_str();
        let index = Rejection::STAT_KEYS.iter().position(|k| *k == key);
        let mut ids = vec![self.rejected_total];
        ids.extend(index.and_then(|i| self.rejected.get(i)).copied());
        ids
    }

    /// The counter of a body fallback (0 if undefined).
    pub fn for_body_fallback(&self, reason: BodyFallback) -> u32 {
        BodyFallback::ALL
            .iter()
            .position(|r| *r == reason)
            .and_then(|i| self.route_input_body.get(i))
            .copied()
            .unwrap_or(0)
    }

    /// The counter of a fallback reason (0 if undefined).
    pub fn for_fallback(&self, reason: FallbackReason) -> u32 {
        FallbackReason::STAT_KEYS
            .iter()
            .position(|k| *k == reason.as_str())
            .and_then(|i| self.fallback.get(i))
            .copied()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> StatIds {
        StatIds {
            fail_open_total: 1,
            fail_open: (10..17).collect(),
            routed: vec![20, 21, 22],
            fallback: vec![30, 31, 32],
            route_calls_total: 2,
            stripped_headers_total: 3,
            ..StatIds::default()
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
            prefill: None,
            on_prefill_pool: true,
            steering_free: true,
            model: None,
        };
        assert_eq!(ids().for_outcome(&outcome), vec![22]);
    }

    #[test]
    fn rejections_count_the_total_and_their_reason() {
        let ids = StatIds {
            rejected_total: 40,
            rejected: (41..51).collect(),
            ..StatIds::default()
        };
        assert_eq!(ids.for_rejection(Rejection::TooLarge), vec![40, 50]);
        let outcome = RouteOutcome::Rejected {
            status: 400,
            reason: switchyard_protocol::route::RejectReason::PromptTooLong,
        };
        assert_eq!(ids.for_outcome(&outcome), vec![40, 42]);
    }

    #[test]
    fn fallbacks_count_their_reason() {
        assert_eq!(ids().for_fallback(FallbackReason::PrefillFailed), 30);
        assert_eq!(ids().for_fallback(FallbackReason::NoPrefillWorker), 31);
        assert_eq!(ids().for_fallback(FallbackReason::PrefillRefused), 32);
        assert_eq!(
            StatIds::default().for_fallback(FallbackReason::PrefillFailed),
            0
        );
    }

    #[test]
    fn undefined_ids_are_skipped_not_panicked_on() {
        let outcome = RouteOutcome::FailOpen(FailOpenReason::NoWorkers);
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
        assert_eq!(
            fallback_stat_name(FallbackReason::PrefillFailed),
            "switchyard.fallback.prefill_failed"
        );
    }
}
