//! Per-request context: strip, buffer, ask the control plane, set the destination, annotate.
//!
//! Phase rules that shape this code:
//! - Request headers may be changed while the request is paused, including from the route
//!   call's callback: Envoy has not passed them on yet because the headers phase returned
//!   `Pause` (StopIteration, allowed by `allow_on_headers_stop_iteration: true`). Setting a
//!   request header clears Envoy's route cache under ABI 0.2.1, so the router and the
//!   override-host load balancer see the new destination.
//! - Pausing in the headers phase matters: were headers to continue, the router would pick
//!   an upstream host before the body (and so the verdict) exists.
//! - Response headers are only writable in `on_http_response_headers`.

use std::rc::Rc;
use std::time::UNIX_EPOCH;

use log::{debug, warn};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use switchyard_protocol::route::{
    ApiKind, API_HEADER, DESTINATION_HEADER, REQUEST_ID_HEADER, ROUTE_HEADER, ROUTE_PATH,
};

use crate::request::{choose_request_id, headers_to_strip, routable_api};
use crate::root::Shared;
use crate::verdict::{classify_route_response, FailOpenReason, RouteOutcome};

/// Response header naming the `host:port` the filter routed to.
pub const DESTINATION_RESPONSE_HEADER: &str = "x-switchyard-destination";

/// Upper bound for reading the buffered body in the trailers phase (the host clamps reads
/// to what is buffered; Envoy's per-connection buffer limit is the real cap).
const MAX_TRAILERS_BODY_READ: usize = 64 << 20;

/// State of one request. Holds nothing but what this request needs.
pub(crate) struct SwitchyardRequest {
    context_id: u32,
    shared: Rc<Shared>,
    /// Set when the request is one we route (POST to an OpenAI path with a body).
    api: Option<ApiKind>,
    request_id: String,
    /// Token of the outstanding route call.
    pending_call: Option<u32>,
    /// What happened, for the response headers.
    outcome: Option<RouteOutcome>,
}

impl SwitchyardRequest {
    pub(crate) fn new(context_id: u32, shared: Rc<Shared>) -> Self {
        SwitchyardRequest {
            context_id,
            shared,
            api: None,
            request_id: String::new(),
            pending_call: None,
            outcome: None,
        }
    }

    fn increment(&self, id: u32) {
        // A stat that cannot be incremented is not worth failing a request over.
        if let Err(status) = hostcalls::increment_metric(id, 1) {
            debug!(
                "#{} increment_metric({id}) failed: {status:?}",
                self.context_id
            );
        }
    }

    /// Records an outcome: sets the destination header when routed, counts it.
    fn apply(&mut self, outcome: RouteOutcome) {
        match &outcome {
            RouteOutcome::Routed { mode, destination } => {
                debug!(
                    "#{} {} -> {destination} ({})",
                    self.context_id,
                    self.request_id,
                    mode.as_str()
                );
                self.set_http_request_header(DESTINATION_HEADER, Some(destination));
            }
            // An outage fails every request open: the stats count those, and a log line per
            // request would flood Envoy's log. Answers that point at a bug or a
            // misconfiguration are worth a line each.
            RouteOutcome::FailOpen(
                reason @ (FailOpenReason::ControlPlaneUnavailable
                | FailOpenReason::Timeout
                | FailOpenReason::EmptyBody),
            ) => {
                debug!(
                    "#{} {} fails open: {reason}",
                    self.context_id, self.request_id
                );
            }
            RouteOutcome::FailOpen(reason) => {
                warn!(
                    "#{} {} fails open: {reason}",
                    self.context_id, self.request_id
                );
            }
        }
        for id in self.shared.stats.for_outcome(&outcome) {
            self.increment(id);
        }
        self.outcome = Some(outcome);
    }

    fn now_nanos(&self) -> u128 {
        // The host's clock (a hostcall, not std's); only used to make ids unique.
        self.get_current_time()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    }

    /// Sends the buffered body to the control plane. Returns false if the call could not
    /// even be dispatched (the request then fails open right away).
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
                self.pending_call = Some(token);
                self.increment(self.shared.stats.route_calls_total);
                true
            }
            Err(status) => {
                warn!("#{} dispatch_http_call failed: {status:?}", self.context_id);
                false
            }
        }
    }
}

impl SwitchyardRequest {
    /// Reads the complete buffered body (up to `size` bytes) and dispatches the route call;
    /// fails open right away when there is nothing to route on or no call can be made.
    fn route_buffered_body(&mut self, size: usize) -> Action {
        let Some(api) = self.api else {
            return Action::Continue;
        };
        let body = self.get_http_request_body(0, size).unwrap_or_default();
        if body.is_empty() {
            self.apply(RouteOutcome::FailOpen(FailOpenReason::EmptyBody));
            return Action::Continue;
        }
        if self.dispatch_route_call(api, &body) {
            Action::Pause
        } else {
            self.apply(RouteOutcome::FailOpen(FailOpenReason::DispatchFailed));
            Action::Continue
        }
    }
}

impl Context for SwitchyardRequest {
    fn on_http_call_response(
        &mut self,
        token_id: u32,
        _headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        if self.pending_call != Some(token_id) {
            return;
        }
        self.pending_call = None;
        let status = self.get_http_call_response_header(":status");
        let body = self
            .get_http_call_response_body(0, body_size)
            .unwrap_or_default();
        let outcome = classify_route_response(status.as_deref(), &body);
        self.apply(outcome);
        self.resume_http_request();
    }
}

impl HttpContext for SwitchyardRequest {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let headers = self.get_http_request_headers();
        let strip = headers_to_strip(headers.iter().map(|(name, _)| name.as_str()));
        for name in &strip {
            self.set_http_request_header(name, None);
            self.increment(self.shared.stats.stripped_headers_total);
        }

        let method = self.get_http_request_header(":method");
        let path = self.get_http_request_header(":path");
        let Some(api) = routable_api(method.as_deref(), path.as_deref()) else {
            return Action::Continue;
        };
        if end_of_stream {
            self.apply(RouteOutcome::FailOpen(FailOpenReason::EmptyBody));
            return Action::Continue;
        }

        let existing = self.get_http_request_header(REQUEST_ID_HEADER);
        let (request_id, generated) =
            choose_request_id(existing.as_deref(), self.context_id, self.now_nanos());
        if generated {
            // The worker and the control plane must see the same id.
            self.set_http_request_header(REQUEST_ID_HEADER, Some(&request_id));
        }
        self.request_id = request_id;
        self.api = Some(api);
        // Hold the headers until the verdict: the router must not pick a host yet.
        Action::Pause
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.api.is_none() || self.outcome.is_some() || self.pending_call.is_some() {
            return Action::Continue;
        }
        if !end_of_stream {
            // StopIterationAndBuffer: Envoy keeps the chunks; at the end `body_size` is all.
            return Action::Pause;
        }
        self.route_buffered_body(body_size)
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        // A body that ends in trailers (HTTP/2 clients may send them) never reaches
        // `end_of_stream` in the body callback; the buffered body is complete now.
        if self.api.is_none() || self.outcome.is_some() || self.pending_call.is_some() {
            return Action::Continue;
        }
        self.route_buffered_body(MAX_TRAILERS_BODY_READ)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if let Some(outcome) = &self.outcome {
            let value = outcome.route_header_value();
            let destination = outcome.destination().map(str::to_string);
            self.set_http_response_header(ROUTE_HEADER, Some(&value));
            if let Some(destination) = destination {
                self.set_http_response_header(DESTINATION_RESPONSE_HEADER, Some(&destination));
            }
        }
        Action::Continue
    }
}
