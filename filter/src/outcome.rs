//! How a request was finally served, as the client sees it in `x-switchyard-route`.
//!
//! A verdict ([`crate::verdict::RouteOutcome`]) is what the control plane asked for; a
//! [`Served`] is what happened after the prefill leg, if any. The two differ when the prefill
//! leg fails: the verdict said `disagg`, the request was served by the decode worker's own
//! prefill (`fallback;reason=prefill_failed`).

use std::fmt;

use switchyard_protocol::route::RouteMode;

use switchyard_protocol::route::RejectReason;

use crate::body::InvalidBody;
use crate::verdict::{FailOpenReason, RouteOutcome};

/// Why a `disagg` verdict was served by local prefill on the decode worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FallbackReason {
    /// The prefill leg failed: unreachable, timed out, a 5xx answer (after the bounded
    /// retries of 502/503/504), or its dispatch was refused.
    PrefillFailed,
    /// The verdict said `disagg` but named no usable prefill worker address.
    NoPrefillWorker,
    /// The prefill engine refused the leg (a 4xx): most often a request the engine refuses
    /// whatever the gateway does (a sampling parameter out of range: the decode worker then
    /// answers the client the same 400), else a gateway whose engine settings do not match
    /// the servers'. Not a prefill worker's failure, so counted apart from those.
    PrefillRefused,
}

impl FallbackReason {
    /// Every reason, in stat order.
    pub const ALL: [FallbackReason; 3] = [
        FallbackReason::PrefillFailed,
        FallbackReason::NoPrefillWorker,
        FallbackReason::PrefillRefused,
    ];

    /// Every stat key, in a fixed order.
    pub const STAT_KEYS: [&'static str; 3] =
        ["prefill_failed", "no_prefill_worker", "prefill_refused"];

    /// The stat key and header reason.
    pub fn as_str(self) -> &'static str {
        match self {
            FallbackReason::PrefillFailed => Self::STAT_KEYS[0],
            FallbackReason::NoPrefillWorker => Self::STAT_KEYS[1],
            FallbackReason::PrefillRefused => Self::STAT_KEYS[2],
        }
    }
}

impl fmt::Display for FallbackReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a routed API request was served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Served {
    /// As the verdict said (`disagg` includes a prefill answer without `kv_transfer_params`,
    /// which vLLM's protocol defines as "decode locally").
    Routed {
        /// The verdict's mode.
        mode: RouteMode,
        /// The decode worker.
        destination: String,
    },
    /// A `disagg` verdict served by local prefill on its decode worker.
    Fallback {
        /// Why.
        reason: FallbackReason,
        /// The decode worker.
        destination: String,
    },
    /// No verdict: Envoy's fallback load balancer picked the worker.
    FailOpen(FailOpenReason),
    /// Refused before any worker saw it, by the gateway (a 400, 404 or 413 answered to the
    /// client).
    Rejected(Rejection),
    /// A concurrent handoff (SGLang) whose prefill leg failed once its decode leg had been
    /// sent: the decode worker waits for KV that will not come and cannot prefill locally
    /// instead, so the gateway answers the client 502 (resetting the decode leg).
    PrefillLost {
        /// The decode worker.
        destination: String,
    },
}

/// Why the gateway refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rejection {
    /// The control plane found a field the engine would refuse (its OpenAI error relayed).
    ControlPlane(RejectReason),
    /// The filter found a body that is not a JSON object (or could still steer a worker).
    Body(InvalidBody),
    /// The body is larger than `max_body_bytes` (413).
    TooLarge,
}

impl Rejection {
    /// Every label, in a fixed order (the root context defines one counter each).
    pub const STAT_KEYS: [&'static str; 10] = [
        "invalid_request",
        "prompt_too_long",
        "unknown_model",
        "not_json",
        "not_an_object",
        "encoded",
        "too_complex",
        "empty_body",
        "not_json_content_type",
        "too_large",
    ];

    /// The label: the header reason and stat key.
    pub fn as_str(self) -> &'static str {
        match self {
            Rejection::ControlPlane(reason) => reason.as_str(),
            Rejection::Body(invalid) => invalid.as_str(),
            Rejection::TooLarge => "too_large",
        }
    }
}

impl Served {
    /// What a verdict becomes when no prefill leg changes it.
    pub fn from_outcome(outcome: &RouteOutcome) -> Served {
        match outcome {
            RouteOutcome::Routed {
                mode, destination, ..
            } => Served::Routed {
                mode: *mode,
                destination: destination.clone(),
            },
            RouteOutcome::FailOpen(reason) => Served::FailOpen(*reason),
            RouteOutcome::Rejected { reason, .. } => {
                Served::Rejected(Rejection::ControlPlane(*reason))
            }
        }
    }

    /// Value of the `x-switchyard-route` response header: `bypass`, `disagg`, `agg`,
    /// `fallback;reason=<reason>`, `fail-open;reason=<reason>`, `rejected;reason=<reason>`
    /// or `error;reason=prefill_failed`.
    pub fn route_header_value(&self) -> String {
        match self {
            Served::Routed { mode, .. } => mode.as_str().to_string(),
            Served::Fallback { reason, .. } => format!("fallback;reason={reason}"),
            Served::FailOpen(reason) => format!("fail-open;reason={reason}"),
            Served::Rejected(why) => format!("rejected;reason={}", why.as_str()),
            Served::PrefillLost { .. } => "error;reason=prefill_failed".to_string(),
        }
    }

    /// The decode worker the filter chose, if it chose one.
    pub fn destination(&self) -> Option<&str> {
        match self {
            Served::Routed { destination, .. }
            | Served::Fallback { destination, .. }
            | Served::PrefillLost { destination } => Some(destination),
            Served::FailOpen(_) | Served::Rejected(_) => None,
        }
    }

    /// The mode label of logs and docs: `bypass`, `disagg`, `agg`, `fallback:<reason>`,
    /// `fail_open:<reason>`, `rejected:<reason>`, `error:prefill_failed`.
    pub fn mode_label(&self) -> String {
        match self {
            Served::Routed { mode, .. } => mode.as_str().to_string(),
            Served::Fallback { reason, .. } => format!("fallback:{reason}"),
            Served::FailOpen(reason) => format!("fail_open:{}", reason.stat_key()),
            Served::Rejected(why) => format!("rejected:{}", why.as_str()),
            Served::PrefillLost { .. } => "error:prefill_failed".to_string(),
        }
    }

    /// Whether the control plane made a verdict for this request (and so tracks its load and
    /// wants its lifecycle reports).
    pub fn has_verdict(&self) -> bool {
        matches!(
            self,
            Served::Routed { .. } | Served::Fallback { .. } | Served::PrefillLost { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_and_labels() {
        let routed = Served::Routed {
            mode: RouteMode::Bypass,
            destination: "a:1".into(),
        };
        assert_eq!(routed.route_header_value(), "bypass");
        assert_eq!(routed.destination(), Some("a:1"));
        let fallback = Served::Fallback {
            reason: FallbackReason::PrefillFailed,
            destination: "a:1".into(),
        };
        assert_eq!(
            fallback.route_header_value(),
            "fallback;reason=prefill_failed"
        );
        assert_eq!(fallback.mode_label(), "fallback:prefill_failed");
        assert!(fallback.has_verdict());
        let invalid = Served::Rejected(Rejection::Body(InvalidBody::NotJson));
        assert_eq!(invalid.route_header_value(), "rejected;reason=not_json");
        assert_eq!(invalid.mode_label(), "rejected:not_json");
        assert!(!invalid.has_verdict());
        assert_eq!(invalid.destination(), None);
        let refused = Served::Rejected(Rejection::ControlPlane(RejectReason::PromptTooLong));
        assert_eq!(
            refused.route_header_value(),
            "rejected;reason=prompt_too_long"
        );
        let failed = Served::FailOpen(FailOpenReason::BadStatus(503));
        assert_eq!(
            failed.route_header_value(),
            "fail-open;reason=bad_status_503"
        );
        assert_eq!(failed.mode_label(), "fail_open:bad_status");
        let lost = Served::PrefillLost {
            destination: "a:1".into(),
        };
        assert_eq!(lost.route_header_value(), "error;reason=prefill_failed");
        assert_eq!(lost.mode_label(), "error:prefill_failed");
        assert!(lost.has_verdict());
        assert_eq!(lost.destination(), Some("a:1"));
    }

    #[test]
    fn rejection_stat_keys_cover_every_reason() {
        let mut all: Vec<Rejection> = RejectReason::ALL
            .into_iter()
            .map(Rejection::ControlPlane)
            .collect();
        all.extend([
            Rejection::Body(InvalidBody::NotJson),
            Rejection::Body(InvalidBody::NotAnObject),
            Rejection::Body(InvalidBody::Encoded),
            Rejection::Body(InvalidBody::TooComplex),
            Rejection::Body(InvalidBody::Empty),
            Rejection::Body(InvalidBody::NotJsonContentType),
            Rejection::TooLarge,
        ]);
        let keys: Vec<&str> = all.iter().map(|r| r.as_str()).collect();
        assert_eq!(keys, Rejection::STAT_KEYS);
    }

    #[test]
    fn a_verdict_maps_to_what_it_says() {
        let outcome = RouteOutcome::Routed {
            mode: RouteMode::Disagg,
            destination: "d:1".into(),
            prefill: Some(crate::verdict::PrefillTarget {
                address: "p:1".into(),
                handoff: switchyard_protocol::handoff::Handoff::VllmNixl,
                bootstrap_port: None,
                disagg_request_id: false,
            }),
            on_prefill_pool: false,
            steering_free: false,
            model: None,
        };
        assert_eq!(
            Served::from_outcome(&outcome),
            Served::Routed {
                mode: RouteMode::Disagg,
                destination: "d:1".into()
            }
        );
    }
}
