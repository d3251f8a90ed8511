//! The prefill leg's answer, turned into the next step (pure).
//!
//! vLLM's disaggregated-prefill proxies retry a prefill only when the answer says the worker
//! or a proxy in front of it is unavailable (502/503/504); anything else is final. A failed
//! `dispatch_http_call` calls back with Envoy's synthetic 503 (unreachable) or 504 (timeout),
//! so those are retried too, within the configured bound. A 200's body goes to the engine's
//! [`switchyard_protocol::handoff::Handoff`], which reads the decode leg out of it.
//!
//! A retry names no worker (the verdict's failed), so Envoy's fallback balancer picks one:
//! on a gateway of several models it must pick among the request's model's prefill workers
//! only, which is what [`prefill_leg_cluster`] chooses (for the first attempt too: its named
//! worker may be gone).

use std::borrow::Cow;

use switchyard_protocol::route::{is_header_safe_model, model_cluster};

use crate::outcome::FallbackReason;

/// What to do after a prefill-leg answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefillStep {
    /// A 200: the handoff reads the decode leg from its body.
    Answered,
    /// Try again (502/503/504 and retries left).
    Retry,
    /// Give up: the decode worker prefills locally.
    Failed(PrefillFailure),
}

/// Why a prefill leg failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefillFailure {
    /// No `:status` at all (the call was reset).
    NoStatus,
    /// A non-200 status (Envoy's synthetic ones included), after any retries.
    Status(u16),
}

impl std::fmt::Display for PrefillFailure {
    /// In words for a client's error message: `answered 500`, `no answer`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PrefillFailure::NoStatus => f.write_str("no answer"),
            // Envoy answers a call it could not deliver with these itself.
            PrefillFailure::Status(503) => f.write_str("answered 503, or could not be reached"),
            PrefillFailure::Status(504) => f.write_str("answered 504, or timed out"),
            PrefillFailure::Status(code) => write!(f, "answered {code}"),
        }
    }
}

/// Classifies a prefill answer's status. `retries_done` counts retries already made.
pub fn classify_prefill_answer(
    status: Option<&str>,
    retries_done: u32,
    max_retries: u32,
) -> PrefillStep {
    let Some(code) = status.and_then(|s| s.trim().parse::<u16>().ok()) else {
        return PrefillStep::Failed(PrefillFailure::NoStatus);
    };
    match code {
        200 => PrefillStep::Answered,
        502..=504 if retries_done < max_retries => PrefillStep::Retry,
        other => PrefillStep::Failed(PrefillFailure::Status(other)),
    }
}

impl PrefillFailure {
    /// How a request whose prefill leg failed so is served: a 4xx is the engine refusing the
    /// leg (most often the request itself, which the decode worker then refuses too), not a
    /// prefill worker's failure.
    pub fn fallback_reason(self) -> FallbackReason {
        match self {
            PrefillFailure::Status(400..=499) => FallbackReason::PrefillRefused,
            _ => FallbackReason::PrefillFailed,
        }
    }
}

/// The cluster a prefill attempt goes to. With `per_model` (the gateway defines a prefill
/// cluster per model, `<prefill_cluster>__<model>`, as the control plane's EDS serves them)
/// and a `model` that can name one, that model's cluster: an attempt then never lands on
/// another model's prefill worker. Otherwise the shared `prefill_cluster`.
pub fn prefill_leg_cluster<'a>(
    prefill_cluster: &'a str,
    per_model: bool,
    model: Option<&str>,
) -> Cow<'a, str> {
    match model {
        Some(model) if per_model && is_header_safe_model(model) => {
            Cow::Owned(model_cluster(prefill_cluster, model))
        }
        _ => Cow::Borrowed(prefill_cluster),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engine_refusing_the_leg_is_not_a_prefill_failure() {
        for code in [400, 404, 422, 499] {
            assert_eq!(
                PrefillFailure::Status(code).fallback_reason(),
                FallbackReason::PrefillRefused,
                "{code}"
            );
        }
        for failure in [
            PrefillFailure::Status(500),
            PrefillFailure::Status(503),
            PrefillFailure::Status(302),
            PrefillFailure::NoStatus,
        ] {
            assert_eq!(failure.fallback_reason(), FallbackReason::PrefillFailed);
        }
    }

    #[test]
    fn a_failure_reads_in_words_for_the_client() {
        // Envoy's own answer for a worker it could not reach is a 503: both are said.
        assert_eq!(
            PrefillFailure::Status(503).to_string(),
            "answered 503, or could not be reached"
        );
        assert_eq!(PrefillFailure::Status(500).to_string(), "answered 500");
        assert_eq!(PrefillFailure::NoStatus.to_string(), "no answer");
    }

    #[test]
    fn retries_stay_in_the_models_cluster_only_when_the_gateway_has_one() {
        assert_eq!(
            prefill_leg_cluster("switchyard_prefill", true, Some("Qwen/Qwen3-8B")),
            "switchyard_prefill__Qwen_Qwen3-8B"
        );
        assert_eq!(
            prefill_leg_cluster("switchyard_prefill", false, Some("Qwen/Qwen3-8B")),
            "switchyard_prefill"
        );
        for unnamed in [None, Some(""), Some(" padded "), Some("line\nbreak")] {
            assert_eq!(
                prefill_leg_cluster("switchyard_prefill", true, unnamed),
                "switchyard_prefill",
                "{unnamed:?}"
            );
        }
    }

    #[test]
    fn a_200_is_answered() {
        assert_eq!(
            classify_prefill_answer(Some("200"), 0, 1),
            PrefillStep::Answered
        );
        assert_eq!(
            classify_prefill_answer(Some(" 200 "), 3, 1),
            PrefillStep::Answered
        );
    }

    #[test]
    fn only_502_503_504_are_retried_and_only_within_the_bound() {
        for code in ["502", "503", "504"] {
            assert_eq!(
                classify_prefill_answer(Some(code), 0, 1),
                PrefillStep::Retry
            );
            assert_eq!(
                classify_prefill_answer(Some(code), 1, 1),
                PrefillStep::Failed(PrefillFailure::Status(code.parse().unwrap()))
            );
        }
        for code in ["400", "500", "429"] {
            assert!(matches!(
                classify_prefill_answer(Some(code), 0, 5),
                PrefillStep::Failed(_)
            ));
        }
        assert_eq!(
            classify_prefill_answer(None, 0, 5),
            PrefillStep::Failed(PrefillFailure::NoStatus)
        );
        assert_eq!(
            classify_prefill_answer(Some("503"), 0, 0),
            PrefillStep::Failed(PrefillFailure::Status(503))
        );
    }
}
