//! Handing the request to Envoy, and the response side: annotations, the lifecycle reports
//! that let the control plane free predicted load (first bytes = prefill done; end of stream
//! = request done, with `usage`), and the release of KV a prefill worker holds for a decode
//! leg that failed or never came.

use log::debug;
use proxy_wasm::traits::{Context, HttpContext};
use switchyard_protocol::lifecycle::LifecycleEvent;
use switchyard_protocol::route::{BYPASS_HEADER, DESTINATION_HEADER, ROUTE_HEADER};

use super::{
    Phase, SwitchyardRequest, DESTINATION_RESPONSE_HEADER, PREFILL_RESPONSE_HEADER,
    UPSTREAM_RESPONSE_HEADER,
};
use crate::headers::StreamHeaders;
use crate::lifecycle::{is_first_token, usage_from_tail, TAIL_BYTES};
use crate::outcome::Served;
use crate::shared::{increment, Release};

impl SwitchyardRequest {
    /// Records how the request is served and, when a decode worker was chosen, names it for
    /// Envoy. `prefill` is the verdict's prefill worker, `hold` the KV it holds for this
    /// request's decode leg.
    pub(super) fn forward(
        &mut self,
        served: Served,
        prefill: Option<String>,
        hold: Option<String>,
    ) {
        if let Some(destination) = served.destination() {
            self.set_http_request_header(DESTINATION_HEADER, Some(destination));
        }
        if matches!(
            served,
            Served::Routed {
                mode: switchyard_protocol::route::RouteMode::Bypass,
                ..
            }
        ) {
            self.set_http_request_header(BYPASS_HEADER, Some("true"));
        }
        if let Served::Fallback { reason, .. } = &served {
            // At debug, as outage fail-opens are: a dead or hung prefill worker sends every
            // disaggregated request here until it expires, and the stats count them.
            increment(self.shared.stats.for_fallback(*reason), 1);
            debug!(
                "#{} {} falls back to local prefill: {reason}",
                self.context_id, self.request_id
            );
        }
        debug!(
            "#{} {} -> {:?} ({})",
            self.context_id,
            self.request_id,
            served.destination(),
            served.mode_label()
        );
        self.phase = Phase::Done {
            served,
            prefill,
            hold,
        };
    }

    /// Reports go for every request the control plane made a verdict for: it predicted load
    /// for them. That includes a request whose client left during the prefill leg (`done`
    /// with `ok: false`), so its load is freed too.
    fn wants_reports(&self) -> bool {
        self.shared.config.lifecycle_reports
            && match &self.phase {
                Phase::Done { served, .. } => served.has_verdict(),
                Phase::Prefilling { .. } => true,
                _ => false,
            }
    }

    /// Sets `x-switchyard-route`, `x-switchyard-destination`, `x-switchyard-prefill`; gives
    /// up the prefill worker's hold if the decode worker refused the handoff.
    pub(super) fn on_response_headers(&mut self, end_of_stream: bool) {
        self.response.status = self.response_header(":status").and_then(|s| s.parse().ok());
        if end_of_stream {
            self.response.complete = true;
        }
        let Phase::Done {
            served, prefill, ..
        } = &self.phase
        else {
            return;
        };
        let value = served.route_header_value();
        let destination = served.destination().map(str::to_string);
        let prefill = prefill.clone();
        self.set_http_response_header(ROUTE_HEADER, Some(&value));
        if let Some(destination) = destination {
            // Envoy falls back to another host of the cluster when the destination refuses
            // the connection or is none of its hosts: served, but away from the cache the
            // verdict chose. Said and counted, so that it is not mistaken for affinity.
            let upstream = self
                .get_property(vec!["upstream", "address"])
                .and_then(|bytes| String::from_utf8(bytes).ok());
            if let Some(upstream) = upstream.filter(|u| *u != destination) {
                increment(self.shared.stats.rerouted_total, 1);
                debug!(
                    "#{} {} served by {upstream}, not its destination {destination}",
                    self.context_id, self.request_id
                );
                self.set_http_response_header(UPSTREAM_RESPONSE_HEADER, Some(&upstream));
            }
            self.set_http_response_header(DESTINATION_RESPONSE_HEADER, Some(&destination));
        }
        if let Some(prefill) = prefill {
            self.set_http_response_header(PREFILL_RESPONSE_HEADER, Some(&prefill));
        }
        let refused = self
            .response
            .status
            .is_none_or(|code| !(200..300).contains(&code));
        if refused {
            self.release_hold("the decode leg was answered with an error");
        }
    }

    /// Reports the first response bytes and keeps the response's tail for `usage`; the body
    /// itself streams on untouched.
    pub(super) fn observe_response_body(&mut self, body_size: usize, end_of_stream: bool) {
        if end_of_stream {
            self.response.complete = true;
        }
        if !self.wants_reports() || body_size == 0 {
            return;
        }
        if !self.response.first_bytes_reported {
            self.response.first_bytes_reported = true;
            if is_first_token(self.response.status) {
                self.shared.report(LifecycleEvent::FirstToken {
                    request_id: self.request_id.clone(),
                });
            }
        }
        let keep = body_size.min(TAIL_BYTES);
        if let Some(bytes) = self.get_http_response_body(body_size - keep, keep) {
            self.response.tail.push(&bytes);
        }
    }

    /// The request is over (done, or the client went away): `done` with what is known, and
    /// the hold given up if no decode worker ever answered.
    pub(super) fn on_request_end(&mut self) {
        if self.response.status.is_none() {
            self.release_hold("the client left before the decode leg answered");
        }
        match self.phase {
            // The route call went out: the control plane may have routed it already, and
            // would count the request in flight until its request timeout.
            Phase::AwaitingVerdict { .. } => {
                if self.shared.config.lifecycle_reports {
                    self.report_unserved(true);
                }
                return;
            }
            Phase::Prefilling { .. } => {
                increment(self.shared.stats.prefill_abandoned_total, 1);
                // Counted; a line each would let clients flood the log.
                debug!(
                    "#{} {} the client left during the prefill leg: the prefill worker keeps its KV until its own lease ends",
                    self.context_id, self.request_id
                );
            }
            _ => {}
        }
        if !self.wants_reports() {
            return;
        }
        let usage = usage_from_tail(self.response.tail.as_bytes()).unwrap_or_default();
        let ok = self.response.complete
            && self
                .response
                .status
                .is_some_and(|code| (200..300).contains(&code));
        self.shared.report(LifecycleEvent::Done {
            request_id: self.request_id.clone(),
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            ok,
            failed_open: false,
            route_call: None,
        });
    }

    /// Reports `done` for a request whose route call went out but which will not be served as
    /// its verdict said (`failed_open`: it fails open instead; else it was refused), so the
    /// control plane does not count it in flight until its request timeout.
    pub(super) fn report_unserved(&mut self, failed_open: bool) {
        self.shared.report(LifecycleEvent::Done {
            request_id: self.request_id.clone(),
            prompt_tokens: None,
            completion_tokens: None,
            ok: false,
            failed_open,
            route_call: self.route_call.filter(|_| failed_open),
        });
    }

    /// Queues the release of the prefill worker's hold, once (the root context sends it).
    fn release_hold(&mut self, why: &str) {
        let Phase::Done {
            prefill: Some(prefill),
            hold,
            ..
        } = &mut self.phase
        else {
            return;
        };
        let Some(hold) = hold.take() else {
            return;
        };
        debug!(
            "#{} {} releases hold {hold} on {prefill}: {why}",
            self.context_id, self.request_id
        );
        self.shared.release(Release {
            prefill: prefill.clone(),
            hold,
        });
    }
}
