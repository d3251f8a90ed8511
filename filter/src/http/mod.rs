//! Per-request context: strip, buffer, check, ask the control plane, run the prefill leg,
//! set the destination, annotate, report.
//!
//! Phase rules that shape this code:
//! - Request headers may be changed while the request is paused, including from a call-back:
//!   Envoy has not passed them on yet because the headers phase returned `Pause`
//!   (StopIteration, allowed by `allow_on_headers_stop_iteration: true`). Setting a request
//!   header clears Envoy's route cache under ABI 0.2.1, so the router and the override-host
//!   load balancer see the new destination.
//! - Pausing in the headers phase matters: were headers to continue, the router would pick
//!   an upstream host before the body (and so the verdict) exists. It also keeps
//!   `content-length` writable until the body is final (the decode leg's body is rewritten).
//! - The body callback returns `Pause` (StopIterationAndBuffer) until `end_of_stream`; the
//!   buffered body stays readable and replaceable (`set_buffer`) from call-backs until the
//!   request resumes.
//! - Response headers are only writable in `on_http_response_headers`.
//!
//! Submodules: `route_call` (body check, route call, verdict), `prefill_leg` (the
//! disaggregated path), `response` (annotations, lifecycle).

mod prefill_leg;
mod response;
mod route_call;

use std::rc::Rc;
use std::time::UNIX_EPOCH;

use log::{debug, warn};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType};
use switchyard_protocol::route::{ApiKind, BYPASS_HEADER, DESTINATION_HEADER, REQUEST_ID_HEADER};

use crate::body::{self, RequestDoc};
use crate::lifecycle::Tail;
use crate::outcome::Served;
use crate::request::{choose_request_id, headers_to_strip, routable_api};
use crate::root::{increment, Shared};
use crate::verdict::{classify_route_response, FailOpenReason, RouteOutcome};

/// Response header naming the `host:port` the filter routed to.
pub const DESTINATION_RESPONSE_HEADER: &str = "x-switchyard-destination";
/// Response header naming the prefill worker of a disaggregated request.
pub const PREFILL_RESPONSE_HEADER: &str = "x-switchyard-prefill";

/// Upper bound for reading the buffered body in the trailers phase (the host clamps reads
/// to what is buffered; `max_body_bytes` is checked on the size read).
const MAX_TRAILERS_BODY_READ: usize = 256 << 20;

/// The outstanding call of a paused request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pending {
    Route(u32),
    Prefill(u32),
}

/// State of one request. Holds nothing but what this request needs.
pub(crate) struct SwitchyardRequest {
    context_id: u32,
    shared: Rc<Shared>,
    /// Set when the request is one we route (POST to an OpenAI path with a body).
    api: Option<ApiKind>,
    request_id: String,
    /// `:path` and `:authority` of the client request (the prefill leg reuses them).
    path: String,
    authority: String,
    /// Whether the client sent `content-length` (kept correct when the body is rewritten).
    had_content_length: bool,
    /// Size of the buffered body as Envoy holds it (what a rewrite replaces).
    body_len: usize,
    /// The parsed body, kept for the decode leg's rewrite.
    doc: Option<RequestDoc>,
    pending: Option<Pending>,
    /// The verdict.
    verdict: Option<RouteOutcome>,
    /// What happened, for the response header and the reports.
    served: Option<Served>,
    /// Prefill-leg state.
    prefill_retries_done: u32,
    prefill_started_ms: u64,
    /// Response side.
    response_status: Option<u16>,
    first_token_reported: bool,
    response_complete: bool,
    tail: Tail,
    /// A local reply (413) was sent: nothing else to do.
    replied: bool,
}

impl SwitchyardRequest {
    pub(crate) fn new(context_id: u32, shared: Rc<Shared>) -> Self {
        SwitchyardRequest {
            context_id,
            shared,
            api: None,
            request_id: String::new(),
            path: String::new(),
            authority: String::new(),
            had_content_length: false,
            body_len: 0,
            doc: None,
            pending: None,
            verdict: None,
            served: None,
            prefill_retries_done: 0,
            prefill_started_ms: 0,
            response_status: None,
            first_token_reported: false,
            response_complete: false,
            tail: Tail::default(),
            replied: false,
        }
    }

    fn now(&self) -> std::time::Duration {
        // The host's clock (a hostcall, not std's).
        self.get_current_time()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
    }

    /// Whether the request still waits for the filter (routed, body not yet handled).
    fn routing_open(&self) -> bool {
        self.api.is_some() && self.served.is_none() && self.pending.is_none() && !self.replied
    }

    /// Answers 413 with an OpenAI-style error without contacting anyone.
    fn reply_too_large(&mut self, size: u64) {
        let limit = self.shared.config.max_body_bytes;
        increment(self.shared.stats.oversized_body_total, 1);
        debug!(
            "#{} {} body of {size} bytes over {limit}: 413",
            self.context_id, self.request_id
        );
        let body = body::too_large_error(size, limit);
        if let Err(status) = hostcalls::send_http_response(
            413,
            vec![("content-type", "application/json")],
            Some(&body),
        ) {
            warn!("#{} cannot send the 413: {status:?}", self.context_id);
        }
        self.replied = true;
    }

    /// Records the final outcome and, when a decode worker was chosen, names it for Envoy.
    fn finish(&mut self, served: Served, bypass: bool) {
        if let Some(destination) = served.destination() {
            self.set_http_request_header(DESTINATION_HEADER, Some(destination));
        }
        if bypass {
            self.set_http_request_header(BYPASS_HEADER, Some("true"));
        }
        if let Served::Fallback { reason, .. } = &served {
            increment(self.shared.stats.for_fallback(*reason), 1);
            warn!(
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
        self.served = Some(served);
    }

    /// Replaces the buffered body (and keeps `content-length` true). False if Envoy refused.
    fn replace_body(&mut self, new_body: &[u8]) -> bool {
        match hostcalls::set_buffer(BufferType::HttpRequestBody, 0, self.body_len, new_body) {
            Ok(()) => {
                self.body_len = new_body.len();
                if self.had_content_length {
                    self.set_http_request_header(
                        "content-length",
                        Some(&new_body.len().to_string()),
                    );
                }
                true
            }
            Err(status) => {
                warn!("#{} cannot replace the body: {status:?}", self.context_id);
                false
            }
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
        let status = self.get_http_call_response_header(":status");
        let body = self
            .get_http_call_response_body(0, body_size)
            .unwrap_or_default();
        match self.pending {
            Some(Pending::Route(token)) if token == token_id => {
                self.pending = None;
                self.apply_verdict(classify_route_response(status.as_deref(), &body));
            }
            Some(Pending::Prefill(token)) if token == token_id => {
                self.pending = None;
                self.on_prefill_answer(status.as_deref(), &body);
            }
            _ => {}
        }
    }
}

impl HttpContext for SwitchyardRequest {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let headers = self.get_http_request_headers();
        let strip = headers_to_strip(headers.iter().map(|(name, _)| name.as_str()));
        for name in &strip {
            self.set_http_request_header(name, None);
            increment(self.shared.stats.stripped_headers_total, 1);
        }

        let method = self.get_http_request_header(":method");
        let path = self.get_http_request_header(":path");
        let Some(api) = routable_api(method.as_deref(), path.as_deref()) else {
            return Action::Continue;
        };
        self.api = Some(api);
        if end_of_stream {
            self.fail_open(FailOpenReason::EmptyBody);
            return Action::Continue;
        }
        let content_length = self.get_http_request_header("content-length");
        self.had_content_length = content_length.is_some();
        if let Some(size) = content_length.and_then(|v| v.trim().parse::<u64>().ok()) {
            // Refuse before buffering a byte of it.
            if size > self.shared.config.max_body_bytes {
                self.reply_too_large(size);
                return Action::Pause;
            }
        }

        let existing = self.get_http_request_header(REQUEST_ID_HEADER);
        let now_nanos = self.now().as_nanos();
        let (request_id, generated) =
            choose_request_id(existing.as_deref(), self.context_id, now_nanos);
        if generated {
            // The workers (both legs) and the control plane must see the same id.
            self.set_http_request_header(REQUEST_ID_HEADER, Some(&request_id));
        }
        self.request_id = request_id;
        self.path = path.unwrap_or_default();
        self.authority = self
            .get_http_request_header(":authority")
            .unwrap_or_default();
        // Hold the headers until the verdict: the router must not pick a host yet.
        Action::Pause
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !self.routing_open() {
            return if self.replied {
                Action::Pause
            } else {
                Action::Continue
            };
        }
        if body_size as u64 > self.shared.config.max_body_bytes {
            // A chunked body has no content-length to refuse early on.
            self.reply_too_large(body_size as u64);
            return Action::Pause;
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
        if !self.routing_open() {
            return Action::Continue;
        }
        self.route_buffered_body(MAX_TRAILERS_BODY_READ)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.annotate_response(end_of_stream);
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.observe_response_body(body_size, end_of_stream);
        Action::Continue
    }

    fn on_log(&mut self) {
        self.report_done();
    }
}
