//! The route call: the screened body (or, with `tokenize: filter`, its prompt's block
//! hashes) to `POST /v1/route`, and the verdict applied (route now, relay a refusal, or start
//! the prefill leg while the request stays paused).

use log::{debug, warn};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use switchyard_protocol::route::{
    ApiKind, RouteMode, API_HEADER, MODEL_HEADER, POOL_HEADER, POOL_PREFILL, REQUEST_ID_HEADER,
    ROUTE_CALL_HEADER, ROUTE_PATH,
};

use super::{Phase, SwitchyardRequest};
use switchyard_protocol::route_input::{
    HashedPrompt, HASHED_PROMPT_CONTENT_TYPE, ROUTE_INPUT_HASHES, ROUTE_INPUT_HEADER,
};

use crate::body::{self, RequestDoc, Screened};
use crate::config::TokenizeMode;
use crate::outcome::{FallbackReason, Rejection, Served};
use crate::shared::increment;
use crate::tokenize::{model_key, BodyFallback};
use crate::verdict::{FailOpenReason, RouteOutcome};

impl SwitchyardRequest {
    /// A routed API request's complete body: screen it (or leave that to the verdict), then
    /// ask the control plane. Returns the body or trailers callback's action.
    pub(super) fn route_body(&mut self, api: ApiKind, body: Vec<u8>) -> Action {
        if body.is_empty() {
            self.reject_body(body::InvalidBody::Empty);
            return Action::Pause;
        }
        // When the control plane tokenizes, it parses the body anyway and says in its verdict
        // whether the body names a steering key. So an object's screen waits for the verdict
        // and runs only if the verdict does not vouch for the body, or if none comes: a pass
        // over the body less on the Envoy worker thread, in series before the route call. A
        // body that does not even start as an object is screened, and refused, now.
        let deferred = self.shared.config.tokenize == TokenizeMode::ControlPlane
            && body::starts_as_object(&body);
        let (body, doc) = if deferred {
            (body, None)
        } else {
            match self.screen_routed_body(&body) {
                Some(Kept::AsIs) => (body, None),
                Some(Kept::Stripped { body, doc }) => (body, Some(doc)),
                None => return Action::Pause,
            }
        };
        let hashed = self.hashed_route_input(api, &body);
        let dispatched = match &hashed {
            Some(input) => self.dispatch_route_call(api, input, true),
            None => self.dispatch_route_call(api, &body, false),
        };
        match dispatched {
            Some(token) => {
                self.phase = Phase::AwaitingVerdict {
                    token,
                    doc,
                    screened: !deferred,
                };
                Action::Pause
            }
            None => {
                if deferred && self.screen_buffered_body().is_none() {
                    return Action::Pause;
                }
                self.fail_open(FailOpenReason::DispatchFailed);
                Action::Continue
            }
        }
    }

    /// Screens a routed request's body: steering keys stripped from the body Envoy holds, or
    /// the client answered 400 (`None`) when the body is not a JSON object.
    fn screen_routed_body(&mut self, body: &[u8]) -> Option<Kept> {
        match body::screen(body) {
            Screened::Clean => Some(Kept::AsIs),
            Screened::Stripped {
                doc,
                body: stripped,
                ..
            } => {
                // A client must not make a worker reach a host of its choosing.
                if !self.replace_body(&stripped) {
                    self.reject_body(body::InvalidBody::NotJson);
                    return None;
                }
                increment(self.shared.stats.client_steering_stripped_total, 1);
                Some(Kept::Stripped {
                    body: stripped,
                    doc,
                })
            }
            Screened::Invalid(invalid) => {
                self.reject_body(invalid);
                None
            }
        }
    }

    /// The deferred screen, on the body Envoy holds: `Some(doc)` to go on (`doc` is the body
    /// parsed if it was stripped), `None` if the client was answered 400.
    fn screen_buffered_body(&mut self) -> Option<Option<RequestDoc>> {
        increment(self.shared.stats.deferred_screens_total, 1);
        let body = self
            .get_http_request_body(0, self.body_len)
            .unwrap_or_default();
        match self.screen_routed_body(&body)? {
            Kept::AsIs => Some(None),
            Kept::Stripped { doc, .. } => Some(Some(doc)),
        }
    }

    /// No verdict: Envoy's fallback load balancer picks the worker.
    pub(super) fn fail_open(&mut self, reason: FailOpenReason) {
        let outcome = RouteOutcome::FailOpen(reason);
        self.count_verdict(&outcome);
        self.name_model();
        self.forward(Served::from_outcome(&outcome), None, None);
    }

    /// Names the body's model in [`MODEL_HEADER`], so that a gateway serving several models
    /// routes a failed-open request to that model's decode cluster (an Envoy route matching
    /// the header) instead of any model's worker. A gateway of one model has no such route
    /// and ignores the header. Under ABI 0.2.1 Envoy clears its route cache when a filter
    /// sets a request header (from Envoy 1.33 only filters of later ABIs must ask with the
    /// `clear_route_cache` foreign function), so the route is chosen again with the header:
    /// checked end to end by tests/tests/e2e_models.rs.
    fn name_model(&mut self) {
        let body = self
            .get_http_request_body(0, self.body_len)
            .unwrap_or_default();
        if let Some(model) = body::model_of(&body) {
            self.set_http_request_header(MODEL_HEADER, Some(&model));
        }
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
                | FailOpenReason::NoWorkers => {
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

    /// In `tokenize: filter` mode, the route call's body as a hashed prompt (the prompt
    /// tokenized and hashed here), counted; `None` to send the client's body (the other
    /// mode, or a [`BodyFallback`], counted by reason).
    fn hashed_route_input(&self, api: ApiKind, body: &[u8]) -> Option<Vec<u8>> {
        if self.shared.config.tokenize != TokenizeMode::Filter {
            return None;
        }
        let stats = &self.shared.stats;
        match self.hash_prompt(api, body) {
            Ok(hashed) => {
                increment(stats.route_input_hashes_total, 1);
                Some(hashed.encode())
            }
            Err(reason) => {
                debug!(
                    "#{} {} route call carries the body: {}",
                    self.context_id,
                    self.request_id,
                    reason.as_str()
                );
                increment(stats.for_body_fallback(reason), 1);
                None
            }
        }
    }

    fn hash_prompt(&self, api: ApiKind, body: &[u8]) -> Result<HashedPrompt, BodyFallback> {
        // Parsed with key order kept (the workspace's serde_json `preserve_order`), as the
        // control plane parses it: chat templates render the client's key order.
        let doc: serde_json::Value =
            serde_json::from_slice(body).map_err(|_| BodyFallback::InvalidRequest)?;
        let model = model_key(&doc)?;
        let loaded = self
            .shared
            .tokenizers
            .try_borrow_mut()
            .ok()
            .and_then(|mut tokenizers| tokenizers.get_or_want(&model))
            .ok_or(BodyFallback::NotLoaded)?;
        loaded.hashed_prompt(api, &doc)
    }

    /// Sends the route input (the screened body, or a hashed prompt when `hashed`) to the
    /// control plane; `None` if the call could not even be dispatched.
    fn dispatch_route_call(&mut self, api: ApiKind, body: &[u8], hashed: bool) -> Option<u32> {
        // The call's number: the host clock in nanoseconds and this context, so two calls
        // under one request id (a client's retry reusing it) never share one.
        let route_call = (self.now_nanos() as u64) ^ u64::from(self.context_id);
        self.route_call = Some(route_call);
        let route_call = route_call.to_string();
        let config = &self.shared.config;
        let mut headers = vec![
            (":method", "POST"),
            (":path", ROUTE_PATH),
            (":authority", config.control_plane_authority.as_str()),
            (API_HEADER, api.as_str()),
            (REQUEST_ID_HEADER, self.request_id.as_str()),
            (ROUTE_CALL_HEADER, route_call.as_str()),
        ];
        if hashed {
            headers.push(("content-type", HASHED_PROMPT_CONTENT_TYPE));
            headers.push((ROUTE_INPUT_HEADER, ROUTE_INPUT_HASHES));
        } else {
            headers.push(("content-type", "application/json"));
        }
        match self.dispatch_http_call(
            &config.control_plane_cluster,
            headers,
            Some(body),
            vec![],
            config.route_timeout(body.len()),
        ) {
            Ok(token) => {
                increment(self.shared.stats.route_calls_total, 1);
                increment(self.shared.stats.route_call_bytes_total, body.len() as i64);
                Some(token)
            }
            Err(status) => {
                // BadArgument is most often a cluster Envoy does not have: name it.
                warn!(
                    "#{} route call to cluster {:?} refused: {status:?} (is control_plane_cluster one of Envoy's clusters?)",
                    self.context_id, config.control_plane_cluster
                );
                None
            }
        }
    }

    /// Applies the route call's outcome. `doc` is the body if screening parsed it; `screened`
    /// whether the body was screened before the call; `answer` is the route answer's body
    /// (relayed to the client on a refusal).
    pub(super) fn apply_verdict(
        &mut self,
        outcome: RouteOutcome,
        doc: Option<RequestDoc>,
        screened: bool,
        answer: &[u8],
    ) {
        let vouched = matches!(
            outcome,
            RouteOutcome::Routed {
                steering_free: true,
                ..
            }
        );
        let doc = if screened || vouched {
            doc
        } else {
            match self.screen_buffered_body() {
                Some(doc) => doc,
                None => {
                    // Refused: the client has its 400. A verdict's request is tracked by
                    // the control plane, and no response will report it done.
                    if matches!(outcome, RouteOutcome::Routed { .. }) {
                        self.report_unserved(false);
                    }
                    return;
                }
            }
        };
        if let RouteOutcome::Routed {
            model: Some(model), ..
        } = &outcome
        {
            // The model's routes send the request to its own cluster, where the named worker
            // is: if it is gone, Envoy's retry and fallback pick another of the same model's
            // workers, never another model's (set before the route is chosen again, as
            // `name_model` explains).
            self.set_http_request_header(MODEL_HEADER, Some(model));
        }
        match outcome {
            RouteOutcome::Rejected { status, reason } => {
                // The client's own mistake, in the engine's words: its 4xx as it is.
                self.reject(Rejection::ControlPlane(reason), status, answer);
            }
            RouteOutcome::Routed {
                mode: RouteMode::Disagg,
                destination,
                prefill,
                on_prefill_pool,
                steering_free,
                model,
            } => {
                self.count_verdict(&RouteOutcome::Routed {
                    mode: RouteMode::Disagg,
                    destination: destination.clone(),
                    prefill: prefill.clone(),
                    on_prefill_pool,
                    steering_free,
                    model,
                });
                match prefill {
                    Some(prefill) => self.start_prefill_leg(doc, destination, prefill),
                    None => {
                        let served = Served::Fallback {
                            reason: FallbackReason::NoPrefillWorker,
                            destination,
                        };
                        self.forward(served, None, None);
                        self.resume_http_request();
                    }
                }
            }
            RouteOutcome::FailOpen(reason) => {
                // The call went out: the control plane may have routed it (a verdict that
                // did not parse) or may yet (it waited in a stopped control plane's socket).
                self.report_unserved(true);
                self.fail_open(reason);
                self.resume_http_request();
            }
            other => {
                if matches!(
                    other,
                    RouteOutcome::Routed {
                        on_prefill_pool: true,
                        ..
                    }
                ) {
                    // A prefill worker serves it whole: the decode cluster does not hold it,
                    // so the gateway's route on this header sends it to the prefill cluster
                    // (set before the route is chosen again, as `name_model` explains).
                    self.set_http_request_header(POOL_HEADER, Some(POOL_PREFILL));
                }
                self.count_verdict(&other);
                self.forward(Served::from_outcome(&other), None, None);
                self.resume_http_request();
            }
        }
    }
}

/// A routed body that passed the screen.
enum Kept {
    /// As the client sent it.
    AsIs,
    /// Without its steering keys: `body` (now also Envoy's copy), parsed as `doc`.
    Stripped { body: Vec<u8>, doc: RequestDoc },
}
