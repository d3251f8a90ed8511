//! Per-request context: strip, screen, buffer, ask the control plane, run the prefill leg,
//! set the destination, annotate, report.
//!
//! A request is always in exactly one [`Phase`]; each carries the data that phase needs and
//! nothing else, and the callbacks move it on with the pure decisions of the sibling modules
//! (`request`, `body`, `verdict`, `prefill`, `outcome`). Only this module and its submodules
//! make hostcalls.
//!
//! Phase rules that shape this code:
//! - Request headers may be changed while the request is paused, including from a call-back:
//!   Envoy has not passed them on yet because the headers phase returned `Pause`
//!   (StopIteration, allowed by `allow_on_headers_stop_iteration: true`). Setting a request
//!   header clears Envoy's route cache under ABI 0.2.1, so the router and the override-host
//!   load balancer see the new destination.
//! - Pausing in the headers phase matters: were headers to continue, the router would pick
//!   an upstream host before the body (and so the verdict) exists. It also keeps
//!   `content-length` writable until the body is final (a screened or decode body is
//!   rewritten).
//! - The body callback returns `Pause` (StopIterationAndBuffer) until `end_of_stream`; the
//!   buffered body stays readable and replaceable (`set_buffer`) from call-backs until the
//!   request resumes.
//! - Response headers are only writable in `on_http_response_headers`.
//!
//! Submodules: `route_call` (screening, the route call, the verdict), `prefill_leg` (the
//! disaggregated path), `response` (annotations, lifecycle, releases).

mod prefill_leg;
mod response;
mod route_call;

use std::rc::Rc;
use std::time::UNIX_EPOCH;

use log::{debug, warn};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType};
use switchyard_protocol::handoff::Handoff;
use switchyard_protocol::openai::is_json_content_type;
use switchyard_protocol::route::{ApiKind, REJECT_HEADER, REQUEST_ID_HEADER, ROUTE_HEADER};

use crate::body::{self, RequestDoc};
use crate::headers::{CallHeaders, StreamHeaders};
use crate::lifecycle::Tail;
use crate::outcome::{Rejection, Served};
use crate::request::{canonical_path, choose_request_id, headers_to_strip, routable_api};
use crate::shared::{increment, Shared};
use crate::verdict::classify_route_response;

/// Response header naming the `host:port` the filter routed to.
pub const DESTINATION_RESPONSE_HEADER: &str = "x-switchyard-destination";
/// Response header naming the upstream that served the request when Envoy served it on
/// another than [`DESTINATION_RESPONSE_HEADER`] (its fallback, or a retry).
pub const UPSTREAM_RESPONSE_HEADER: &str = "x-switchyard-upstream";
/// Response header naming the prefill worker of a disaggregated request.
pub const PREFILL_RESPONSE_HEADER: &str = "x-switchyard-prefill";

/// Upper bound for reading the buffered body in the trailers phase (the host clamps reads
/// to what is buffered; `max_body_bytes` is checked on the size read).
const MAX_TRAILERS_BODY_READ: usize = 256 << 20;

/// The disaggregated path of a request, from the verdict on.
#[derive(Debug)]
struct PrefillLeg {
    /// The client's body, parsed (the decode leg is built from it).
    doc: RequestDoc,
    /// The verdict's decode worker.
    decode: String,
    /// The verdict's prefill worker.
    prefill: String,
    /// The engine's handoff protocol.
    handoff: Handoff,
    /// The id both legs carry (TensorRT-LLM's `disagg_request_id`), when the verdict asks for
    /// one: drawn once per request, so retries of the context leg carry it too.
    disagg_request_id: Option<u64>,
    /// Retries made so far.
    retries: u32,
    /// When the first attempt was dispatched (ms, host clock).
    started_ms: u64,
}

/// The prefill leg of a concurrent handoff (SGLang), in flight beside the decode leg.
#[derive(Debug)]
struct ConcurrentPrefill {
    /// The call's token.
    token: u32,
    /// When it was dispatched (ms, host clock).
    started_ms: u64,
}

/// Where a request is.
#[derive(Debug)]
enum Phase {
    /// Not a routed API request: its body (it has one) is buffered to be screened.
    Screening,
    /// An API request refused on its headers, answered once its small body has arrived
    /// (`body::refusal_waits_for_body`): the body is read and dropped, never passed on.
    Refusing(body::InvalidBody),
    /// An API request whose body is buffering.
    Buffering(ApiKind),
    /// Waiting for the answer to route call `token`; `doc` is the body if screening parsed it,
    /// `screened` whether the body was screened before the call (else the verdict may vouch
    /// for it, or it is screened when the answer comes).
    AwaitingVerdict {
        token: u32,
        doc: Option<RequestDoc>,
        screened: bool,
    },
    /// The prefill leg's attempt `token` is in flight.
    Prefilling { token: u32, leg: PrefillLeg },
    /// Handed to Envoy (or answered by the filter) as `served`. `prefill` is the verdict's
    /// prefill worker; `hold` the KV it holds for this request's decode leg, to release if
    /// that leg fails or never comes.
    Done {
        served: Served,
        prefill: Option<String>,
        hold: Option<String>,
    },
    /// Nothing for the filter to do (headers not seen yet, a bodiless or screened request).
    Passing,
}

/// The response as seen so far (for annotations and lifecycle reports).
#[derive(Debug, Default)]
struct ResponseSide {
    status: Option<u16>,
    first_bytes_reported: bool,
    complete: bool,
    tail: Tail,
}

/// State of one request. Holds nothing but what this request needs.
pub(crate) struct SwitchyardRequest {
    context_id: u32,
    shared: Rc<Shared>,
    phase: Phase,
    request_id: String,
    /// `:path` (canonical, query kept) and `:authority` of the client request; the prefill
    /// leg reuses them.
    path: String,
    authority: String,
    /// Whether the client sent `content-length` (kept correct when the body is rewritten).
    had_content_length: bool,
    /// Size of the buffered body as Envoy holds it (what a rewrite replaces).
    body_len: usize,
    /// A concurrent handoff's prefill leg, while in flight.
    concurrent_prefill: Option<ConcurrentPrefill>,
    /// The number of the route call sent (`ROUTE_CALL_HEADER`), which a `failed_open`
    /// report repeats.
    route_call: Option<u64>,
    response: ResponseSide,
}

impl SwitchyardRequest {
    /// Keeps the client's `x-request-id` if it is usable, else replaces it with one of ours:
    /// the workers (both legs) and the control plane must see the same, usable id.
    fn settle_request_id(&mut self) {
        let existing = self.request_header(REQUEST_ID_HEADER);
        let (request_id, generated) =
            choose_request_id(existing.as_deref(), self.context_id, self.now_nanos());
        if generated {
            self.set_http_request_header(REQUEST_ID_HEADER, Some(&request_id));
        }
        self.request_id = request_id;
    }

    pub(crate) fn new(context_id: u32, shared: Rc<Shared>) -> Self {
        SwitchyardRequest {
            context_id,
            shared,
            phase: Phase::Passing,
            request_id: String::new(),
            path: String::new(),
            authority: String::new(),
            had_content_length: false,
            body_len: 0,
            concurrent_prefill: None,
            route_call: None,
            response: ResponseSide::default(),
        }
    }

    /// The host's clock (a hostcall, not std's), in nanoseconds since the Unix epoch.
    fn now_nanos(&self) -> u128 {
        self.get_current_time()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
    }

    fn now_ms(&self) -> u64 {
        (self.now_nanos() / 1_000_000) as u64
    }

    /// Refuses a body the filter cannot route, with its status and OpenAI-shaped error.
    fn reject_body(&mut self, invalid: body::InvalidBody) {
        self.reject(
            Rejection::Body(invalid),
            invalid.status(),
            &body::invalid_body_error(invalid),
        );
    }

    /// Answers the client without contacting anyone, as `rejection` with `status` and an
    /// OpenAI-style `body`; the request is done.
    fn reject(&mut self, rejection: Rejection, status: u16, body: &[u8]) {
        for id in self.shared.stats.for_rejection(rejection) {
            increment(id, 1);
        }
        debug!(
            "#{} {} rejected ({}): {status}",
            self.context_id,
            self.request_id,
            rejection.as_str()
        );
        let served = Served::Rejected(rejection);
        let route = served.route_header_value();
        if let Err(status) = hostcalls::send_http_response(
            u32::from(status),
            self.local_reply_headers(&route),
            Some(body),
        ) {
            warn!("#{} cannot send a local reply: {status:?}", self.context_id);
        }
        self.phase = Phase::Done {
            served,
            prefill: None,
            hold: None,
        };
    }

    /// The headers of an answer the filter gives itself: JSON, how the request was served,
    /// and its request id, as every served response carries it (for the client's logs).
    fn local_reply_headers<'a>(&'a self, route: &'a str) -> Vec<(&'a str, &'a str)> {
        let mut headers = vec![("content-type", "application/json"), (ROUTE_HEADER, route)];
        if !self.request_id.is_empty() {
            headers.push((REQUEST_ID_HEADER, self.request_id.as_str()));
        }
        headers
    }

    fn reply_too_large(&mut self, size: u64) {
        let limit = self.shared.config.max_body_bytes;
        self.reject(
            Rejection::TooLarge,
            413,
            &body::too_large_error(size, limit),
        );
    }

    /// Refuses an API request on its headers as `invalid`: at once when its body is large,
    /// else once the body has arrived (`body::refusal_waits_for_body` says why).
    fn refuse_on_headers(
        &mut self,
        invalid: body::InvalidBody,
        declared_length: Option<u64>,
    ) -> Action {
        if body::refusal_waits_for_body(declared_length) {
            self.phase = Phase::Refusing(invalid);
        } else {
            self.reject_body(invalid);
        }
        Action::Pause
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

    /// Whether the body callbacks still have work: the body is being buffered.
    fn buffering(&self) -> bool {
        matches!(self.phase, Phase::Screening | Phase::Buffering(_))
    }

    /// The complete buffered body arrived (`size` bytes at most): screen it and move on.
    /// Returns the body or trailers callback's action.
    fn on_complete_body(&mut self, size: usize) -> Action {
        let body = self.get_http_request_body(0, size).unwrap_or_default();
        if body.len() as u64 > self.shared.config.max_body_bytes {
            self.reply_too_large(body.len() as u64);
            return Action::Pause;
        }
        self.body_len = body.len();
        // A byte-order mark (which vLLM's JSON reader accepts) is dropped here, so that the
        // screen, the control plane and every worker read the body without it.
        let stripped = switchyard_protocol::without_bom(&body);
        let body = if stripped.len() < body.len() && self.replace_body(stripped) {
            stripped.to_vec()
        } else {
            body
        };
        match self.phase {
            Phase::Buffering(api) => self.route_body(api, body),
            _ => self.pass_screened(&body),
        }
    }

    /// A request the filter does not route: strip steering keys from a JSON object body;
    /// refuse a body that is not one yet might still steer a worker; pass everything else.
    fn pass_screened(&mut self, body: &[u8]) -> Action {
        self.phase = Phase::Passing;
        match body::screen(body) {
            body::Screened::Clean => Action::Continue,
            body::Screened::Stripped { body, .. } => {
                if self.replace_body(&body) {
                    increment(self.shared.stats.client_steering_stripped_total, 1);
                    Action::Continue
                } else {
                    self.reject_body(body::InvalidBody::NotJson);
                    Action::Pause
                }
            }
            body::Screened::Invalid(invalid) if body::may_steer(body) => {
                self.reject_body(invalid);
                Action::Pause
            }
            body::Screened::Invalid(_) => Action::Continue,
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
        let status = self.call_response_header(":status");
        if let Some(prefill) = self
            .concurrent_prefill
            .take_if(|prefill| prefill.token == token_id)
        {
            return self.on_concurrent_prefill_answer(status.as_deref(), prefill);
        }
        let body = self
            .get_http_call_response_body(0, body_size)
            .unwrap_or_default();
        match std::mem::replace(&mut self.phase, Phase::Passing) {
            Phase::AwaitingVerdict {
                token,
                doc,
                screened,
            } if token == token_id => {
                let reject = self.call_response_header(REJECT_HEADER);
                let outcome = classify_route_response(status.as_deref(), reject.as_deref(), &body);
                self.apply_verdict(outcome, doc, screened, &body);
            }
            Phase::Prefilling { token, leg } if token == token_id => {
                self.on_prefill_answer(status.as_deref(), &body, leg);
            }
            other => self.phase = other,
        }
    }
}

impl HttpContext for SwitchyardRequest {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let names = self.request_header_names();
        let strip = headers_to_strip(names.iter().map(String::as_str));
        for name in &strip {
            self.set_http_request_header(name, None);
            increment(self.shared.stats.stripped_headers_total, 1);
        }
        if end_of_stream {
            // No body: nothing to screen. A routed API request without one is refused, as the
            // engine would refuse it (not failed open: nothing is wrong with the routing).
            let method = self.request_header(":method");
            let path = self.request_header(":path");
            if routable_api(method.as_deref(), path.as_deref()).is_some() {
                self.settle_request_id();
                self.reject_body(body::InvalidBody::Empty);
                return Action::Pause;
            }
            return Action::Continue;
        }
        let method = self.request_header(":method");
        let path = self.request_header(":path").unwrap_or_default();
        let routable = routable_api(method.as_deref(), Some(&path));
        let content_length = self.request_header("content-length");
        self.had_content_length = content_length.is_some();
        let declared_length = content_length.and_then(|v| v.trim().parse::<u64>().ok());
        if let Some(size) = declared_length {
            // Refuse before buffering a byte of it, with the request id every other answer
            // to an API request carries.
            if size > self.shared.config.max_body_bytes {
                if routable.is_some() {
                    self.settle_request_id();
                }
                self.reply_too_large(size);
                return Action::Pause;
            }
        }
        let Some(api) = routable else {
            // Not routed, but its body is screened before anything passes on.
            self.phase = Phase::Screening;
            return Action::Pause;
        };
        // The worker gets the path its router matches, whatever spelling the client used.
        let query = path.find('?').map(|i| &path[i..]).unwrap_or("");
        let canonical = format!("{}{query}", canonical_path(&path).unwrap_or_default());
        if canonical != path {
            self.set_http_request_header(":path", Some(&canonical));
        }
        self.settle_request_id();
        let content_type = self.get_http_request_header_bytes("content-type");
        if !is_json_content_type(content_type.as_deref()) {
            // vLLM refuses it before reading the body; so does the gateway, before a prefill
            // leg (which the filter sends as JSON) could hold KV for a refused decode leg.
            return self.refuse_on_headers(body::InvalidBody::NotJsonContentType, declared_length);
        }
        if body::is_encoded(self.request_header("content-encoding").as_deref()) {
            // Compressed, the prompt cannot be read, and the engine would refuse it too; said
            // before the client uploads (and Envoy buffers) more than a small body of it.
            return self.refuse_on_headers(body::InvalidBody::Encoded, declared_length);
        }
        self.path = canonical;
        self.authority = self.request_header(":authority").unwrap_or_default();
        self.phase = Phase::Buffering(api);
        // Hold the headers until the verdict: the router must not pick a host yet.
        Action::Pause
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if let Phase::Refusing(invalid) = self.phase {
            let max_body_bytes = self.shared.config.max_body_bytes;
            if body::refused_body_read_enough(body_size as u64, end_of_stream, max_body_bytes) {
                self.reject_body(invalid);
                // The rest of a body past the limit is not kept.
                return Action::Continue;
            }
            return Action::Pause;
        }
        if !self.buffering() {
            // After a refusal (its reply sent) the rest of the body is not kept: buffered,
            // it could pass Envoy's own limit, whose plain-text 413 then raced the reply.
            return Action::Continue;
        }
        if body_size as u64 > self.shared.config.max_body_bytes {
            // A chunked body has no content-length to refuse early on.
            self.reply_too_large(body_size as u64);
            return Action::Continue;
        }
        if !end_of_stream {
            // StopIterationAndBuffer: Envoy keeps the chunks; at the end `body_size` is all.
            return Action::Pause;
        }
        self.on_complete_body(body_size)
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        if let Phase::Refusing(invalid) = self.phase {
            self.reject_body(invalid);
            return Action::Continue;
        }
        // A body that ends in trailers (HTTP/2 clients may send them) never reaches
        // `end_of_stream` in the body callback; the buffered body is complete now.
        if !self.buffering() {
            return Action::Continue;
        }
        self.on_complete_body(MAX_TRAILERS_BODY_READ)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.on_response_headers(end_of_stream);
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.observe_response_body(body_size, end_of_stream);
        Action::Continue
    }

    fn on_log(&mut self) {
        self.on_request_end();
    }
}
