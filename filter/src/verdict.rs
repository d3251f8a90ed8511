//! The control plane's answer to a route call, turned into what the filter does.
//!
//! Pure: the http context reads `:status` and the body through hostcalls and hands them
//! here. A failed `dispatch_http_call` still calls back, with a synthetic `:status` from
//! Envoy's own router (503 when the control plane is unreachable, 504 on timeout) and a
//! plain-text body, so the status is checked, not only the presence of headers. A 5xx that
//! carries the control plane's own [`ApiError`] JSON is the control plane speaking, not an
//! outage: `no_workers` (it knows no live decode worker: starting, or no worker registers) is
//! a reason of its own, anything else is reported as `bad_status_<code>`.

use std::fmt;

use switchyard_protocol::handoff::{Handoff, LegOrder};
use switchyard_protocol::route::{
    is_header_safe_model, ApiError, Endpoint, RejectReason, RouteMode, Verdict, NO_WORKERS,
};
use switchyard_protocol::worker::Engine;

/// Why a request failed open (went to Envoy's fallback load balancer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailOpenReason {
    /// The control plane could not be reached (connection refused/reset, no healthy host, or
    /// a call-back without any `:status`).
    ControlPlaneUnavailable,
    /// The route call did not answer within `route_timeout_ms`.
    Timeout,
    /// The control plane answered with this non-200 status.
    BadStatus(u16),
    /// A 200 whose body is not a usable verdict (bad JSON, unusable address).
    BadVerdict,
    /// `dispatch_http_call` itself was refused (e.g. the cluster is not configured).
    DispatchFailed,
    /// The control plane knows no live decode worker (its 503 `no_workers`): it has just
    /// started and heard no heartbeat yet, or no worker reaches it.
    NoWorkers,
}

impl FailOpenReason {
    /// Every stat key, in a fixed order (the root context defines one counter per key).
    pub const STAT_KEYS: [&'static str; 6] = [
        "control_plane_unavailable",
        "timeout",
        "bad_status",
        "bad_verdict",
        "dispatch_failed",
        "no_workers",
    ];

    /// The stat key: like the header reason, but without the status code, so the number of
    /// counters stays fixed.
    pub fn stat_key(self) -> &'static str {
        match self {
            FailOpenReason::ControlPlaneUnavailable => Self::STAT_KEYS[0],
            FailOpenReason::Timeout => Self::STAT_KEYS[1],
            FailOpenReason::BadStatus(_) => Self::STAT_KEYS[2],
            FailOpenReason::BadVerdict => Self::STAT_KEYS[3],
            FailOpenReason::DispatchFailed => Self::STAT_KEYS[4],
            FailOpenReason::NoWorkers => Self::STAT_KEYS[5],
        }
    }
}

impl fmt::Display for FailOpenReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailOpenReason::BadStatus(code) => write!(f, "bad_status_{code}"),
            other => f.write_str(other.stat_key()),
        }
    }
}

/// The prefill worker of a `disagg` verdict and how its legs hand KV over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefillTarget {
    /// `host:port` for `x-gateway-destination-endpoint`.
    pub address: String,
    /// The engine's handoff protocol.
    pub handoff: Handoff,
    /// SGLang's bootstrap port on the prefill worker's host (always present for SGLang).
    pub bootstrap_port: Option<u16>,
    /// The legs carry a `disagg_request_id` (TensorRT-LLM servers with the Python KV
    /// transceiver; the verdict's `disagg_request_id`).
    pub disagg_request_id: bool,
}

impl PrefillTarget {
    /// The verdict's prefill worker, if the filter can run a handoff with it: a usable
    /// address and, for SGLang, a bootstrap port.
    fn from_verdict(
        prefill: Endpoint,
        engine: Engine,
        disagg_request_id: bool,
    ) -> Option<PrefillTarget> {
        let handoff = engine.handoff();
        let needs_bootstrap = handoff.order() == LegOrder::Concurrent;
        let bootstrap_ok = !needs_bootstrap || prefill.bootstrap_port.is_some_and(|p| p != 0);
        (is_valid_endpoint_address(&prefill.address) && bootstrap_ok).then_some(PrefillTarget {
            address: prefill.address,
            handoff,
            bootstrap_port: prefill.bootstrap_port,
            disagg_request_id: disagg_request_id && handoff == Handoff::TrtllmDisagg,
        })
    }
}

/// What the filter does with a routed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteOutcome {
    /// Send it to `destination` (the verdict's decode worker), after the prefill leg on
    /// `prefill` when the mode is `disagg`.
    Routed {
        /// The verdict's mode.
        mode: RouteMode,
        /// `host:port` for `x-gateway-destination-endpoint`.
        destination: String,
        /// The prefill worker, when the verdict names a usable one.
        prefill: Option<PrefillTarget>,
        /// `destination` is a prefill worker serving the request whole (the verdict's
        /// `decode_on_prefill`): the request goes to the prefill cluster.
        on_prefill_pool: bool,
        /// The control plane found the body free of steering keys (the verdict's
        /// `steering_free`): the filter need not screen it.
        steering_free: bool,
        /// The pool file's model the request was routed within (the verdict's `model`, when
        /// a header can carry it): named to Envoy so that a retry stays in that model.
        model: Option<String>,
    },
    /// Leave the destination unset: Envoy's fallback load balancer picks a worker.
    FailOpen(FailOpenReason),
    /// The control plane refused the client's request (a request the engine would refuse):
    /// answer the client with `status` and the route answer's body, as they are.
    Rejected {
        /// The route answer's 4xx status.
        status: u16,
        /// Why.
        reason: RejectReason,
    },
}

impl RouteOutcome {
    /// Value of the `x-switchyard-route` response header.
    pub fn route_header_value(&self) -> String {
        match self {
            RouteOutcome::Routed { mode, .. } => mode.as_str().to_string(),
            RouteOutcome::FailOpen(reason) => format!("fail-open;reason={reason}"),
            RouteOutcome::Rejected { reason, .. } => format!("rejected;reason={}", reason.as_str()),
        }
    }

    /// The destination, if routed.
    pub fn destination(&self) -> Option<&str> {
        match self {
            RouteOutcome::Routed { destination, .. } => Some(destination),
            RouteOutcome::FailOpen(_) | RouteOutcome::Rejected { .. } => None,
        }
    }
}

/// Turns a route call's `:status`, its `x-switchyard-reject` header and its body into an
/// outcome. Never panics. A refusal counts only as a 4xx naming a known reason: anything
/// else that is not a usable verdict fails open, so a broken control plane can never make the
/// gateway refuse requests.
pub fn classify_route_response(
    status: Option<&str>,
    reject: Option<&str>,
    body: &[u8],
) -> RouteOutcome {
    let Some(code) = status.and_then(|s| s.trim().parse::<u16>().ok()) else {
        return RouteOutcome::FailOpen(FailOpenReason::ControlPlaneUnavailable);
    };
    if let Some(reason) = reject.and_then(|r| RejectReason::parse(r.trim())) {
        if (400..500).contains(&code) {
            return RouteOutcome::Rejected {
                status: code,
                reason,
            };
        }
    }
    if code == 200 {
        return match serde_json::from_slice::<Verdict>(body) {
            // A verdict of a later protocol version may mean something else by the same
            // fields ("a meaning never changes within a version"): not one to follow.
            Ok(verdict)
                if switchyard_protocol::unsupported_version(verdict.v).is_none()
                    && is_valid_endpoint_address(&verdict.decode.address) =>
            {
                RouteOutcome::Routed {
                    mode: verdict.mode,
                    destination: verdict.decode.address,
                    prefill: verdict.prefill.and_then(|p| {
                        PrefillTarget::from_verdict(p, verdict.engine, verdict.disagg_request_id)
                    }),
                    on_prefill_pool: verdict.decode_on_prefill,
                    steering_free: verdict.steering_free,
                    model: verdict.model.filter(|m| is_header_safe_model(m)),
                }
            }
            _ => RouteOutcome::FailOpen(FailOpenReason::BadVerdict),
        };
    }
    let api_error = serde_json::from_slice::<ApiError>(body).ok();
    let reason = match (code, api_error) {
        (503, None) => FailOpenReason::ControlPlaneUnavailable,
        (504, None) => FailOpenReason::Timeout,
        (503, Some(e)) if e.code == NO_WORKERS => FailOpenReason::NoWorkers,
        _ => FailOpenReason::BadStatus(code),
    };
    RouteOutcome::FailOpen(reason)
}

/// Whether `address` is a `host:port` Envoy's override-host policy can match and that is safe
/// as a header value: a non-empty host of address characters, a port in 1..=65535. IPv6 hosts
/// come bracketed (`[::1]:8000`).
pub fn is_valid_endpoint_address(address: &str) -> bool {
    let Some((host, port)) = address.rsplit_once(':') else {
        return false;
    };
    let port_ok = !port.is_empty()
        && port.len() <= 5
        && port.bytes().all(|b| b.is_ascii_digit())
        && port.parse::<u16>().is_ok_and(|p| p != 0);
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'));
    port_ok && host_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict_json(mode: &str, address: &str) -> Vec<u8> {
        serde_json::json!({
            "request_id": "r1", "mode": mode,
            "decode": {"worker_id": "decode-1", "address": address},
            "isl": 100, "cached_tokens": 0, "eff_isl": 100, "reason": "bypass:isl_bounding"
        })
        .to_string()
        .into_bytes()
    }

    #[test]
    fn a_200_verdict_routes_to_its_decode_worker() {
        let outcome =
            classify_route_response(Some("200"), None, &verdict_json("bypass", "127.0.0.1:9001"));
        assert_eq!(outcome.destination(), Some("127.0.0.1:9001"));
        assert_eq!(outcome.route_header_value(), "bypass");
    }

    #[test]
    fn a_verdict_of_a_later_protocol_version_fails_open() {
        let mut verdict: serde_json::Value =
            serde_json::from_slice(&verdict_json("bypass", "127.0.0.1:9001")).unwrap();
        // Fields a newer control plane adds within the version are ignored.
        verdict["v"] = 1.into();
        verdict["added_later"] = serde_json::json!({"x": 1});
        let outcome = classify_route_response(Some("200"), None, verdict.to_string().as_bytes());
        assert_eq!(outcome.destination(), Some("127.0.0.1:9001"));
        for v in [0, switchyard_protocol::PROTOCOL_VERSION + 1] {
            verdict["v"] = v.into();
            assert_eq!(
                classify_route_response(Some("200"), None, verdict.to_string().as_bytes()),
                RouteOutcome::FailOpen(FailOpenReason::BadVerdict),
                "v {v}"
            );
        }
    }

    #[test]
    fn disagg_names_its_prefill_worker_when_usable() {
        let mut verdict: serde_json::Value =
            serde_json::from_slice(&verdict_json("disagg", "10.0.0.2:80")).unwrap();
        verdict["prefill"] = serde_json::json!({"worker_id": "p", "address": "10.0.0.3:81"});
        let outcome = classify_route_response(Some("200"), None, verdict.to_string().as_bytes());
        assert_eq!(
            outcome,
            RouteOutcome::Routed {
                mode: RouteMode::Disagg,
                destination: "10.0.0.2:80".into(),
                prefill: Some(PrefillTarget {
                    address: "10.0.0.3:81".into(),
                    handoff: Handoff::VllmNixl,
                    bootstrap_port: None,
                    disagg_request_id: false,
                }),
                on_prefill_pool: false,
                steering_free: false,
                model: None,
            }
        );
        assert_eq!(outcome.route_header_value(), "disagg");
        verdict["prefill"]["address"] = "no port".into();
        let outcome = classify_route_response(Some("200"), None, verdict.to_string().as_bytes());
        assert!(
            matches!(outcome, RouteOutcome::Routed { prefill: None, .. }),
            "{outcome:?}"
        );
    }

    #[test]
    fn the_verdicts_engine_picks_the_handoff_and_sglang_needs_a_bootstrap_port() {
        let mut verdict: serde_json::Value =
            serde_json::from_slice(&verdict_json("disagg", "10.0.0.2:80")).unwrap();
        verdict["prefill"] = serde_json::json!({"worker_id": "p", "address": "10.0.0.3:81"});
        let prefill_of = |verdict: &serde_json::Value| match classify_route_response(
            Some("200"),
            None,
            verdict.to_string().as_bytes(),
        ) {
            RouteOutcome::Routed { prefill, .. } => prefill,
            other => panic!("{other:?}"),
        };
        verdict["engine"] = "trtllm".into();
        assert_eq!(
            prefill_of(&verdict).map(|p| (p.handoff, p.disagg_request_id)),
            Some((Handoff::TrtllmDisagg, false))
        );
        // TensorRT-LLM's legs carry a disagg_request_id when the verdict asks; no other
        // engine's do.
        verdict["disagg_request_id"] = true.into();
        assert_eq!(
            prefill_of(&verdict).map(|p| p.disagg_request_id),
            Some(true)
        );
        verdict["engine"] = "vllm".into();
        assert_eq!(
            prefill_of(&verdict).map(|p| p.disagg_request_id),
            Some(false)
        );
        verdict["disagg_request_id"] = false.into();
        verdict["engine"] = "sglang".into();
        assert_eq!(prefill_of(&verdict), None, "no bootstrap port");
        verdict["prefill"]["bootstrap_port"] = 0.into();
        assert_eq!(prefill_of(&verdict), None, "port 0");
        verdict["prefill"]["bootstrap_port"] = 8998.into();
        assert_eq!(
            prefill_of(&verdict),
            Some(PrefillTarget {
                address: "10.0.0.3:81".into(),
                handoff: Handoff::SglangBootstrap,
                bootstrap_port: Some(8998),
                disagg_request_id: false,
            })
        );
        // An engine this filter does not know is not a verdict it can follow.
        verdict["engine"] = "mystery".into();
        assert_eq!(
            classify_route_response(Some("200"), None, verdict.to_string().as_bytes()),
            RouteOutcome::FailOpen(FailOpenReason::BadVerdict)
        );
    }

    #[test]
    fn a_prefill_worker_serving_a_request_whole_is_in_the_prefill_pool() {
        let mut verdict: serde_json::Value =
            serde_json::from_slice(&verdict_json("agg", "10.0.0.3:81")).unwrap();
        verdict["reason"] = "agg:decode_pool_full".into();
        verdict["decode_on_prefill"] = true.into();
        verdict["steering_free"] = true.into();
        let outcome = classify_route_response(Some("200"), None, verdict.to_string().as_bytes());
        assert_eq!(
            outcome,
            RouteOutcome::Routed {
                mode: RouteMode::Agg,
                destination: "10.0.0.3:81".into(),
                prefill: None,
                on_prefill_pool: true,
                steering_free: true,
                model: None,
            }
        );
        assert_eq!(outcome.route_header_value(), "agg");
    }

    #[test]
    fn synthetic_statuses_map_to_outage_reasons() {
        let envoy_503 = b"upstream connect error or disconnect/reset before headers";
        let cases = [
            (None, &b""[..], "fail-open;reason=control_plane_unavailable"),
            (
                Some("503"),
                &envoy_503[..],
                "fail-open;reason=control_plane_unavailable",
            ),
            (
                Some("504"),
                &b"upstream request timeout"[..],
                "fail-open;reason=timeout",
            ),
            (
                Some("abc"),
                &b""[..],
                "fail-open;reason=control_plane_unavailable",
            ),
        ];
        for (status, body, expected) in cases {
            assert_eq!(
                classify_route_response(status, None, body).route_header_value(),
                expected
            );
        }
    }

    #[test]
    fn control_plane_errors_are_bad_status_with_the_code() {
        let api_error = br#"{"code":"no_workers","message":"no decode worker is live"}"#;
        let outcome = classify_route_response(Some("503"), None, api_error);
        assert_eq!(outcome, RouteOutcome::FailOpen(FailOpenReason::NoWorkers));
        assert_eq!(outcome.route_header_value(), "fail-open;reason=no_workers");
        let other = br#"{"code":"internal","message":"the router task is gone"}"#;
        assert_eq!(
            classify_route_response(Some("503"), None, other).route_header_value(),
            "fail-open;reason=bad_status_503"
        );
        let outcome = classify_route_response(Some("400"), None, b"");
        assert_eq!(
            outcome.route_header_value(),
            "fail-open;reason=bad_status_400"
        );
    }

    #[test]
    fn a_4xx_naming_a_reason_is_relayed_and_anything_else_fails_open() {
        let body = br#"{"error":{"message":"max_tokens must be at least 1","type":"BadRequestError","param":"max_tokens","code":400}}"#;
        let outcome = classify_route_response(Some("400"), Some("invalid_request"), body);
        assert_eq!(
            outcome,
            RouteOutcome::Rejected {
                status: 400,
                reason: RejectReason::InvalidRequest
            }
        );
        assert_eq!(
            outcome.route_header_value(),
            "rejected;reason=invalid_request"
        );
        assert_eq!(
            classify_route_response(Some("404"), Some("unknown_model"), b"{}"),
            RouteOutcome::Rejected {
                status: 404,
                reason: RejectReason::UnknownModel
            }
        );
        // A 5xx or an unknown reason is not the client's fault.
        for (status, reject) in [
            ("503", "invalid_request"),
            ("400", "teapot"),
            ("200", "invalid_request"),
        ] {
            assert!(
                !matches!(
                    classify_route_response(Some(status), Some(reject), body),
                    RouteOutcome::Rejected { .. }
                ),
                "{status} {reject}"
            );
        }
    }

    #[test]
    fn unusable_verdicts_fail_open() {
        for body in [
            &b"not json"[..],
            br#"{"mode":"bypass"}"#,
            &verdict_json("teleport", "127.0.0.1:1"),
            &verdict_json("bypass", ""),
            &verdict_json("bypass", "127.0.0.1"),
            &verdict_json("bypass", "127.0.0.1:0"),
            &verdict_json("bypass", "127.0.0.1:99999"),
            &verdict_json("bypass", "evil\r\nx: y:80"),
        ] {
            assert_eq!(
                classify_route_response(Some("200"), None, body),
                RouteOutcome::FailOpen(FailOpenReason::BadVerdict)
            );
        }
    }

    #[test]
    fn addresses() {
        assert!(is_valid_endpoint_address("127.0.0.1:8000"));
        assert!(is_valid_endpoint_address("[::1]:8000"));
        assert!(is_valid_endpoint_address("worker-0.svc:80"));
        assert!(!is_valid_endpoint_address(":80"));
        assert!(!is_valid_endpoint_address("host:"));
        assert!(!is_valid_endpoint_address("host:+80"));
    }

    #[test]
    fn stat_keys_are_distinct_and_cover_every_reason() {
        let reasons = [
            FailOpenReason::ControlPlaneUnavailable,
            FailOpenReason::Timeout,
            FailOpenReason::BadStatus(500),
            FailOpenReason::BadVerdict,
            FailOpenReason::DispatchFailed,
            FailOpenReason::NoWorkers,
        ];
        let keys: Vec<_> = reasons.iter().map(|r| r.stat_key()).collect();
        assert_eq!(keys, FailOpenReason::STAT_KEYS);
    }
}
