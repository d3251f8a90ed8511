//! The response side: annotations, and the lifecycle reports that let the control plane free
//! predicted load (first bytes = prefill done; end of stream = request done, with `usage`).

use proxy_wasm::traits::HttpContext;
use switchyard_protocol::lifecycle::LifecycleEvent;
use switchyard_protocol::route::ROUTE_HEADER;

use super::{SwitchyardRequest, DESTINATION_RESPONSE_HEADER, PREFILL_RESPONSE_HEADER};
use crate::lifecycle::{usage_from_tail, TAIL_BYTES};
use crate::outcome::Served;
use crate::verdict::RouteOutcome;

impl SwitchyardRequest {
    /// Reports go for every request the control plane made a verdict for: it predicted load
    /// for them. That includes a request whose client left during the prefill leg (`done`
    /// with `ok: false`), so its load is freed too.
    fn wants_reports(&self) -> bool {
        self.shared.config.lifecycle_reports
            && matches!(self.verdict, Some(RouteOutcome::Routed { .. }))
    }

    /// Sets `x-switchyard-route`, `x-switchyard-destination`, `x-switchyard-prefill`.
    pub(super) fn annotate_response(&mut self, end_of_stream: bool) {
        self.response_status = self
            .get_http_response_header(":status")
            .and_then(|s| s.parse().ok());
        if end_of_stream {
            self.response_complete = true;
        }
        let Some(served) = &self.served else {
            return;
        };
        let value = served.route_header_value();
        let destination = served.destination().map(str::to_string);
        let prefill = match (&self.verdict, served) {
            (
                Some(RouteOutcome::Routed { prefill, .. }),
                Served::Routed { .. } | Served::Fallback { .. },
            ) => prefill.clone(),
            _ => None,
        };
        self.set_http_response_header(ROUTE_HEADER, Some(&value));
        if let Some(destination) = destination {
            self.set_http_response_header(DESTINATION_RESPONSE_HEADER, Some(&destination));
        }
        if let Some(prefill) = prefill {
            self.set_http_response_header(PREFILL_RESPONSE_HEADER, Some(&prefill));
        }
    }

    /// Reports the first response bytes and keeps the response's tail for `usage`; the body
    /// itself streams on untouched.
    pub(super) fn observe_response_body(&mut self, body_size: usize, end_of_stream: bool) {
        if end_of_stream {
            self.response_complete = true;
        }
        if !self.wants_reports() || body_size == 0 {
            return;
        }
        if !self.first_token_reported {
            self.first_token_reported = true;
            self.shared.report(LifecycleEvent::FirstToken {
                request_id: self.request_id.clone(),
            });
        }
        let keep = body_size.min(TAIL_BYTES);
        if let Some(bytes) = self.get_http_response_body(body_size - keep, keep) {
            self.tail.push(&bytes);
        }
    }

    /// At the end of the stream (or when the client went away): `done` with what is known.
    pub(super) fn report_done(&mut self) {
        if !self.wants_reports() {
            return;
        }
        let usage = usage_from_tail(self.tail.as_bytes()).unwrap_or_default();
        let ok = self.response_complete
            && self
                .response_status
                .is_some_and(|code| (200..300).contains(&code));
        self.shared.report(LifecycleEvent::Done {
            request_id: self.request_id.clone(),
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            ok,
        });
    }
}
