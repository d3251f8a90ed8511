//! The route call: the body check, `POST /v1/route`, and applying the verdict (route now, or
//! start the prefill leg while the request stays paused).

use log::{debug, warn};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use switchyard_protocol::route::{ApiKind, RouteMode, API_HEADER, REQUEST_ID_HEADER, ROUTE_PATH};

use super::{Pending, SwitchyardRequest};
use crate::body::{self, RequestDoc};
use crate::outcome::{FallbackReason, Served};
use crate::root::increment;
use crate::verdict::{FailOpenReason, RouteOutcome};

impl SwitchyardRequest {
    /// Reads the complete buffered body (up to `size` bytes), checks it, and dispatches the
    /// route call. Returns the action for the body/trailers callback.
    pub(super) fn route_buffered_body(&mut self, size: usize) -> Action {
        let Some(api) = self.api else {
            return Action::Continue;
        };
        let body = self.get_http_request_body(0, size).unwrap_or_default();
        if body.len() as u64 > self.shared.config.max_body_bytes {
            self.reply_too_large(body.len() as u64);
            return Action::Pause;
        }
        self.body_len = body.len();
        if body.is_empty() {
            self.fail_open(FailOpenReason::EmptyBody);
            return Action::Continue;
        }
        let valid = match body::inspect(api, &body) {
            Ok(valid) => valid,
            Err(invalid) => {
                increment(self.shared.stats.invalid_body_total, 1);
                debug!(
                    "#{} {} invalid body: {invalid}",
                    self.context_id, self.request_id
                );
                self.served = Some(Served::InvalidBody(invalid));
                return Action::Continue;
            }
        };
        let mut body = body;
        if valid.has_client_kv_params {
            // A client must not make a decode worker pull KV from a host of its choosing.
            if let Ok(mut doc) = RequestDoc::parse(&body) {
                doc.strip_kv_params();
                if let Ok(stripped) = doc.to_bytes() {
                    if self.replace_body(&stripped) {
                        increment(self.shared.stats.client_kv_params_stripped_total, 1);
                        body = stripped;
                        self.doc = Some(doc);
                    }
                }
            }
        }
        if self.dispatch_route_call(api, &body) {
            Action::Pause
        } else {
            self.fail_open(FailOpenReason::DispatchFailed);
            Action::Continue
        }
    }

    pub(super) fn fail_open(&mut self, reason: FailOpenReason) {
        let outcome = RouteOutcome::FailOpen(reason);
        self.count_verdict(&outcome);
        self.finish(Served::from_outcome(&outcome), false);
    }

    fn count_verdict(&self, outcome: &RouteOutcome) {
        for id in self.shared.stats.for_outcome(outcome) {
            increment(id, 1);
        }
        if let RouteOutcome::FailOpen(reason) = outcome {
            // An outage fails every request open: the stats count those, and a log line per
            // request would flood Envoy's log. Answers that point at a bug or a
            // misconfiguration are worth a line each.
            match reason {
                FailOpenReason::ControlPlaneUnavailable
                | FailOpenReason::Timeout
                | FailOpenReason::EmptyBody => {
                    debug!(
                        "#{} {} fails open: {reason}",
                        self.context_id, self.request_id
                    )
                }
                _ => warn!(
                    "#{} {} fails open: {reason}",
                    self.context_id, self.request_id
                ),
            }
        }
    }

    /// Sends the buffered body to the control plane. Returns false if the call could not
    /// even be dispatched.
    fn dispatch_route_call(&mut self, api: ApiKind, body: &[u8]) -> bool {
        let config = &self.shared.config;
        let headers = vec![
            (":method", "POST"),
            (":path", ROUTE_PATH),
            (":authority", config.control_plane_authority.as_str()),
            ("content-type", "application/json"),
            (API_HEADER, api.as_str()),
            (REQUEST_ID_HEADER, self.request_id.as_str()),
        ];
        let result = self.dispatch_http_call(
            &config.control_plane_cluster,
            headers,
            Some(body),
            vec![],
            config.route_timeout(),
        );
        match result {
            Ok(token) => {
                self.pending = Some(Pending::Route(token));
                increment(self.shared.stats.route_calls_total, 1);
                true
            }
            Err(status) => {
                warn!("#{} dispatch_http_call failed: {status:?}", self.context_id);
                false
            }
        }
    }

    /// Applies the verdict: route, or start the prefill leg (the request stays paused).
    pub(super) fn apply_verdict(&mut self, outcome: RouteOutcome) {
        self.count_verdict(&outcome);
        self.verdict = Some(outcome.clone());
        match outcome {
            RouteOutcome::Routed {
                mode: RouteMode::Disagg,
                destination,
                prefill: Some(prefill),
            } => {
                if !self.start_prefill_leg(&prefill) {
                    self.finish(
                        Served::Fallback {
                            reason: FallbackReason::PrefillFailed,
                            destination,
                        },
                        false,
                    );
                    self.resume_http_request();
                }
            }
            RouteOutcome::Routed {
                mode: RouteMode::Disagg,
                destination,
                prefill: None,
            } => {
                self.finish(
                    Served::Fallback {
                        reason: FallbackReason::NoPrefillWorker,
                        destination,
                    },
                    false,
                );
                self.resume_http_request();
            }
            other => {
                let bypass = matches!(
                    other,
                    RouteOutcome::Routed {
                        mode: RouteMode::Bypass,
                        ..
                    }
                );
                self.finish(Served::from_outcome(&other), bypass);
                self.resume_http_request();
            }
        }
    }
}
