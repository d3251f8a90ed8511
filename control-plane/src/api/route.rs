//! `POST /v1/route`: the client's OpenAI body in, a
//! [`Verdict`](switchyard_protocol::route::Verdict) out.
//!
//! Steps: API kind from `x-switchyard-api`, request id from `x-request-id` (made up when
//! missing), body read with a size limit, JSON parsed with key order kept (chat templates
//! render the client's key order), prompt rendered and looked up in the segment cache on the
//! request's task and encoded there when little is uncached, else on a blocking thread
//! (bounded by `--route-tokenize-threads`), then the router owner decides. Each failure is a typed
//! [`RouteFailure`] with its own status and code.
//!
//! A filter that tokenizes itself sends a [`HashedPrompt`] instead of the body
//! (`x-switchyard-route-input: hashes`): the same steps run on its fields (the body without
//! the prompt), with its block hashes and ISL in place of tokenizing, so both inputs meet one
//! validation path and one router call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::time::Instant;
use warp::http::{HeaderMap, StatusCode};
use warp::reply::Response;
use warp::Reply;

use switchyard_protocol::json_values::parse_bounded;
use switchyard_protocol::openai::{
    check_kv_cache_report_mode, check_prompt_length, generation_params, prompt_count,
    InvalidRequest, Truncation, CLIENT_STEERING_KEYS,
};
use switchyard_protocol::route::RouteMode;
use switchyard_protocol::route::{
    is_usable_request_id, ApiKind, RejectReason, API_HEADER, MAX_REQUEST_ID_LEN, NO_WORKERS,
    REJECT_HEADER, REQUEST_ID_HEADER, ROUTE_CALL_HEADER,
};
use switchyard_protocol::route_input::{HashedPrompt, ROUTE_INPUT_HASHES, ROUTE_INPUT_HEADER};
use switchyard_protocol::worker::Engine;

use super::{declared_length, error_reply, read_body, ApiState};
use crate::metrics::{DecisionLabels, ModelDecisionLabels};
use crate::models::{ModelRefusal, ServedModel};
use crate::router::{RouteError, Routed};
use crate::service::tokenizer::{TokenizeFailure, Tokenizing};
use crate::service::{RoutePrompt, RouteRequest};
use crate::status::DecisionRecord;

/// On a dry run's answer: the verdict was shown, not decided.
pub const DRY_RUN_HEADER: &str = "x-switchyard-dry-run";

/// The request id of a dry run's verdict when the call names none.
pub const DRY_RUN_REQUEST_ID: &str = "dry-run";

/// Why a route request got no verdict.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RouteFailure {
    /// `x-switchyard-api` missing or not `chat` / `completions`.
    #[error("header {API_HEADER} must be \"chat\" or \"completions\", got {0}")]
    UnknownApi(String),
    /// `x-request-id` unusable.
    #[error("header {REQUEST_ID_HEADER}: {0}")]
    BadRequestId(String),
    /// The client's request is one the engine would refuse: the answer is the OpenAI error
    /// for the client, which the filter relays as is.
    #[error("{reason:?}: {error}")]
    Client {
        /// Which kind of refusal (the `x-switchyard-reject` value).
        reason: RejectReason,
        /// The field and message.
        error: InvalidRequest,
    },
    /// The body names a model the gateway does not serve: OpenAI's 404 `model_not_found`,
    /// which the filter relays as is.
    #[error("the model `{0}` does not exist")]
    UnknownModel(String),
    /// A route input the filter should not have sent: an unknown `x-switchyard-route-input`,
    /// or a [`HashedPrompt`] that does not decode.
    #[error("route input: {0}")]
    BadRouteInput(String),
    /// A query parameter other than `dry_run=true|false`.
    #[error("query: {0}")]
    BadQuery(String),
    /// The tokenizer failed on a valid body.
    #[error("tokenizer failed: {0}")]
    Tokenizer(String),
    /// No live worker can decode.
    #[error("no live decode workers")]
    NoWorkers,
    /// Shutting down.
    #[error("the control plane is shutting down")]
    Unavailable,
}

impl RouteFailure {
    /// A client error about the body as a whole or one of its fields; the message names the
    /// field too (`messages[1].content: must be a string`).
    fn invalid(param: impl Into<String>, message: impl std::fmt::Display) -> Self {
        let param = param.into();
        RouteFailure::Client {
            reason: RejectReason::InvalidRequest,
            error: InvalidRequest::bad(param.clone(), format!("{param}: {message}")),
        }
    }

    /// HTTP status and stable error code (the `switchyard_route_bad_requests_total` label).
    pub fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            RouteFailure::UnknownApi(_) => (StatusCode::BAD_REQUEST, "unknown_api"),
            RouteFailure::BadRequestId(_) => (StatusCode::BAD_REQUEST, "invalid_request_id"),
            RouteFailure::BadRouteInput(_) => (StatusCode::BAD_REQUEST, "bad_route_input"),
            RouteFailure::BadQuery(_) => (StatusCode::BAD_REQUEST, "bad_query"),
            RouteFailure::Client { reason, error } => (
                StatusCode::from_u16(error.kind.status()).unwrap_or(StatusCode::BAD_REQUEST),
                reason.as_str(),
            ),
            RouteFailure::UnknownModel(_) => {
                (StatusCode::NOT_FOUND, RejectReason::UnknownModel.as_str())
            }
            RouteFailure::Tokenizer(_) => (StatusCode::INTERNAL_SERVER_ERROR, "tokenizer"),
            RouteFailure::NoWorkers => (StatusCode::SERVICE_UNAVAILABLE, NO_WORKERS),
            RouteFailure::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        }
    }

    /// The HTTP answer: the client's OpenAI error with [`REJECT_HEADER`] for client errors,
    /// our own [`ApiError`](switchyard_protocol::route::ApiError) otherwise.
    pub fn into_reply(self) -> Response {
        let (status, code) = self.status_and_code();
        match self {
            RouteFailure::Client { reason, error } => warp::reply::with_header(
                warp::reply::with_status(warp::reply::json(&error.to_json()), status),
                REJECT_HEADER,
                reason.as_str(),
            )
            .into_response(),
            RouteFailure::UnknownModel(model) => warp::reply::with_header(
                warp::reply::with_status(warp::reply::json(&model_not_found(&model)), status),
                REJECT_HEADER,
                RejectReason::UnknownModel.as_str(),
            )
            .into_response(),
            other => error_reply(status, code, other.to_string()),
        }
    }
}

/// OpenAI's answer to a model it does not serve (the body vLLM and OpenAI give).
pub fn model_not_found(model: &str) -> serde_json::Value {
    serde_json::json!({
        "error": {
            "message": format!("The model `{model}` does not exist."),
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    })
}

/// Makes request ids unique within this process and, through the start time in the prefix,
/// across restarts.
#[derive(Debug)]
pub struct RequestIds {
    prefix: String,
    next: AtomicU64,
}

impl RequestIds {
    /// Ids `sy-<prefix>-<n>`.
    pub fn new(prefix: impl Into<String>) -> Self {
        RequestIds {
            prefix: prefix.into(),
            next: AtomicU64::new(1),
        }
    }

    /// The next id.
    pub fn next_id(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("sy-{}-{n}", self.prefix)
    }
}

fn api_kind(headers: &HeaderMap) -> Result<ApiKind, RouteFailure> {
    let value = headers
        .get(API_HEADER)
        .ok_or_else(|| RouteFailure::UnknownApi("nothing".into()))?;
    let text = value
        .to_str()
        .map_err(|_| RouteFailure::UnknownApi("a non-ASCII value".into()))?;
    ApiKind::parse(text.trim()).ok_or_else(|| RouteFailure::UnknownApi(format!("{text:?}")))
}

fn request_id(headers: &HeaderMap, ids: &RequestIds) -> Result<String, RouteFailure> {
    match headers.get(REQUEST_ID_HEADER) {
        None => Ok(ids.next_id()),
        Some(v) => {
            let text = v
                .to_str()
                .map_err(|_| RouteFailure::BadRequestId("not ASCII".into()))?;
            if text.is_empty() {
                Ok(ids.next_id())
            } else if text.len() > MAX_REQUEST_ID_LEN {
                Err(RouteFailure::BadRequestId(format!(
                    "longer than {MAX_REQUEST_ID_LEN} characters"
                )))
            } else if !is_usable_request_id(text) {
                Err(RouteFailure::BadRequestId(
                    "must be visible ASCII without spaces".into(),
                ))
            } else {
                Ok(text.to_string())
            }
        }
    }
}

/// Whether the call asks for a dry run (`?dry_run=true`): the only query parameter. Anything
/// else is refused rather than ignored, so a misspelt `dry_run` cannot book a real decision.
fn dry_run(query: &str) -> Result<bool, RouteFailure> {
    let mut dry_run = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key != "dry_run" {
            return Err(RouteFailure::BadQuery(format!(
                "unknown parameter {key:?} (the only one is dry_run)"
            )));
        }
        let asked = match value {
            "true" | "1" => true,
            "false" | "0" => false,
            other => {
                return Err(RouteFailure::BadQuery(format!(
                    "dry_run must be true, false, 1 or 0, got {other:?}"
                )))
            }
        };
        // Twice, the later one could turn a dry run into a decision unseen.
        if dry_run.replace(asked).is_some() {
            return Err(RouteFailure::BadQuery("dry_run given twice".into()));
        }
    }
    Ok(dry_run.unwrap_or(false))
}

/// What a route call carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RouteInput {
    /// The client's body.
    Body,
    /// A [`HashedPrompt`]: the filter tokenized.
    Hashes,
}

fn route_input(headers: &HeaderMap) -> Result<RouteInput, RouteFailure> {
    match headers.get(ROUTE_INPUT_HEADER).map(|v| v.to_str()) {
        None => Ok(RouteInput::Body),
        Some(Ok(value)) if value.trim() == ROUTE_INPUT_HASHES => Ok(RouteInput::Hashes),
        Some(value) => Err(RouteFailure::BadRouteInput(format!(
            "{ROUTE_INPUT_HEADER} must be \"{ROUTE_INPUT_HASHES}\" or absent, got {:?}",
            value.unwrap_or("(not ASCII)")
        ))),
    }
}

/// Uncached prompt bytes encoded on the request's own task rather than a blocking thread:
/// about 500 tokens, a few hundred microseconds of BPE, less than the hand-off to a blocking
/// thread costs (docs/performance.md, "Over HTTP"). A warm multi-turn prompt leaves its new
/// message to encode; a chunk the last turn ended in (~1 KiB) plus its new text fits.
const INLINE_ENCODE_BYTES: usize = 2 << 10;

/// Bodies up to this size are planned (template, cache lookups) on the request's task: about
/// 1 ms of work at 2 MiB. A larger body (up to `--max-route-body-bytes`) goes to a blocking
/// thread whole, so one huge prompt cannot hold a runtime worker for milliseconds.
const INLINE_PLAN_MAX_BODY_BYTES: usize = 2 << 20;

/// Tokenizes `body` (`body_bytes` long): the template and cache lookups here, the encoding
/// too when little is uncached, else on a blocking thread once its lane has a permit.
async fn tokenize(
    state: &ApiState,
    model: &ServedModel,
    api: ApiKind,
    body: serde_json::Value,
    body_bytes: usize,
) -> Result<Vec<u32>, RouteFailure> {
    // The work done here is caught like the blocking thread's: a tokenizer panic answers 500
    // instead of dropping the connection.
    let tokenizer = Arc::clone(&model.tokenizer);
    let here = if body_bytes <= INLINE_PLAN_MAX_BODY_BYTES {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            tokenizer.tokenize_here(api, body, INLINE_ENCODE_BYTES)
        }))
        .map_err(|_| RouteFailure::Tokenizer("tokenizer panicked".into()))?
    } else {
        Tokenizing::whole(tokenizer, api, body)
    };
    let result = match here {
        Tokenizing::Done(result) => result,
        Tokenizing::Rest(rest) => off_runtime(state, body_bytes, rest).await?,
    };
    result.map_err(RouteFailure::from)
}

/// Runs tokenizer work of a `body_bytes` body on a blocking thread, within its lane (see
/// [`super::tokenize_lanes`]), so that it holds no runtime thread.
async fn off_runtime<T: Send + 'static>(
    state: &ApiState,
    body_bytes: usize,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, RouteFailure> {
    let permit = state
        .tokenize_lanes
        .acquire(body_bytes)
        .await
        .map_err(|_| RouteFailure::Unavailable)?;
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        work()
    })
    .await
    .map_err(|join| RouteFailure::Tokenizer(format!("tokenizer task failed: {join}")))
}

impl From<TokenizeFailure> for RouteFailure {
    fn from(failure: TokenizeFailure) -> Self {
        match failure {
            TokenizeFailure::InvalidRequest { field, message } => {
                RouteFailure::invalid(field, message)
            }
            TokenizeFailure::Internal(message) => RouteFailure::Tokenizer(message),
        }
    }
}

/// Checks every prompt of a completions batch after the first (checked as the routed prompt)
/// against the model's context, as the engine does before serving any of them, once cut as
/// the request asks: one empty or too long prompt refuses the whole request. Off the runtime
/// threads, like any long tokenization (a batch is rare and may be large).
async fn check_batch_lengths(
    state: &ApiState,
    model: &ServedModel,
    batch: serde_json::Value,
    truncation: Option<Truncation>,
    body_bytes: usize,
) -> Result<(), RouteFailure> {
    let tokenizer = Arc::clone(&model.tokenizer);
    let lengths = off_runtime(state, body_bytes, move || {
        tokenizer.later_completion_prompt_lengths(&batch)
    })
    .await?
    .map_err(RouteFailure::from)?;
    for (j, tokens) in (1..).zip(lengths) {
        let tokens = truncation.map_or(tokens, |t| t.kept(tokens).len());
        check_prompt_length(tokens, model.max_model_len).map_err(|error| RouteFailure::Client {
            reason: RejectReason::of_refused_prompt(tokens),
            error: InvalidRequest::bad(
                format!("prompt[{j}]"),
                format!("prompt[{j}]: {}", error.message),
            ),
        })?;
    }
    Ok(())
}

/// A hashed prompt cut as the engine will cut it. The filter sends the body instead when a
/// request asks for a cut (only the control plane knows the context `-1` resolves against),
/// so this serves older filters: a cut that keeps the first tokens keeps their blocks; one
/// that keeps the last shifts every block, and the prompt is routed as uncached.
fn truncated_hashes(hashed: HashedPrompt, truncation: Option<Truncation>) -> RoutePrompt {
    let HashedPrompt {
        isl,
        block_size,
        mut hashes,
        ..
    } = hashed;
    let Some(kept) = truncation.map(|t| t.kept(isl as usize)) else {
        return RoutePrompt::Hashed {
            isl,
            block_size,
            hashes,
        };
    };
    if kept.start == 0 {
        hashes.truncate(kept.end / block_size.get() as usize);
    } else {
        hashes.clear();
    }
    RoutePrompt::Hashed {
        isl: kept.len() as u32,
        block_size,
        hashes,
    }
}

/// A route call's verdict, with what the handler records beside it.
struct Decided {
    routed: Routed,
    /// The declared model it was routed among (`None` without declared models).
    model: Option<String>,
    /// Shown, not decided (`?dry_run=true`).
    dry_run: bool,
}

async fn decide<S, B>(
    query: &str,
    headers: &HeaderMap,
    body: S,
    state: &ApiState,
) -> Result<Decided, (&'static str, Response)>
where
    S: futures::Stream<Item = Result<B, warp::Error>> + Send,
    B: warp::Buf,
{
    let fail = |f: RouteFailure| (f.status_and_code().1, f.into_reply());
    let dry_run = dry_run(query).map_err(fail)?;
    let api = api_kind(headers).map_err(fail)?;
    // A dry run draws no id from the sequence the decisions' made-up ids come from.
    let request_id = match headers.get(REQUEST_ID_HEADER) {
        None if dry_run => DRY_RUN_REQUEST_ID.to_string(),
        _ => request_id(headers, &state.request_ids).map_err(fail)?,
    };
    let input = route_input(headers).map_err(fail)?;
    let bytes = read_body(body, state.max_route_body_bytes, declared_length(headers)).await?;
    let hashed = match input {
        RouteInput::Body => None,
        RouteInput::Hashes => Some(
            HashedPrompt::decode(&bytes)
                .map_err(|e| fail(RouteFailure::BadRouteInput(e.to_string())))?,
        ),
    };
    // What is validated: the body, or the hashed prompt's fields (the body less its prompt).
    let fields = hashed.as_ref().map_or(&bytes[..], |h| &h.fields[..]);
    // Bytes do not bound a tree: 15 MiB of `[{},{},...]` grew about 55× in a plain parse.
    let json = parse_bounded(switchyard_protocol::without_bom(fields))
        .map_err(|e| fail(RouteFailure::invalid("body", e)))?;
    let Some(object) = json.as_object() else {
        return Err(fail(RouteFailure::invalid("body", "must be a JSON object")));
    };
    // The filter passes such a body on without screening it again (`Verdict::steering_free`).
    let steering_free = hashed.is_none()
        && !CLIENT_STEERING_KEYS
            .iter()
            .any(|key| object.contains_key(*key));
    let model = state.models.resolve(object).map_err(|refusal| {
        fail(match refusal {
            ModelRefusal::Unknown(name) => RouteFailure::UnknownModel(name),
            ModelRefusal::NotAString => RouteFailure::invalid("model", "must be a string"),
            ModelRefusal::Missing => {
                RouteFailure::invalid("model", "required: this gateway serves several models")
            }
        })
    })?;
    // Before tokenizing: a request the engine would refuse costs nothing more, nor one the
    // gateway refuses itself.
    let params = generation_params(api, object, model.max_model_len)
        .and_then(|params| check_kv_cache_report_mode(object).map(|()| params))
        .map_err(|error| {
            fail(RouteFailure::Client {
                reason: RejectReason::InvalidRequest,
                error,
            })
        })?;
    // Every sequence the request generates: `n` for each prompt of a completions batch.
    let prompts = prompt_count(api, object);
    let choices = params.n.saturating_mul(prompts);
    // A batch is routed by its first prompt, but the engine serves (or refuses) each one.
    let batch = (prompts > 1 && hashed.is_none()).then(|| json.clone());
    let prompt = match hashed {
        None => {
            let mut tokens = tokenize(state, &model, api, json, bytes.len())
                .await
                .map_err(fail)?;
            if let Some(truncation) = params.truncation {
                truncation.apply(&mut tokens);
            }
            RoutePrompt::Tokens(tokens)
        }
        Some(h) => truncated_hashes(h, params.truncation),
    };
    let prompt = if params.prompt_logprobs {
        prompt.recomputed()
    } else if params.salted {
        prompt.uncached()
    } else {
        prompt
    };
    let isl = prompt.as_prompt().isl() as usize;
    check_prompt_length(isl, model.max_model_len).map_err(|error| {
        fail(RouteFailure::Client {
            reason: RejectReason::of_refused_prompt(isl),
            error,
        })
    })?;
    if let Some(batch) = batch {
        check_batch_lengths(state, &model, batch, params.truncation, bytes.len())
            .await
            .map_err(fail)?;
    }
    let request = RouteRequest {
        request_id,
        // Unparsable, it numbers nothing: the call is taken as one of an older filter.
        route_call: headers
            .get(ROUTE_CALL_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok()),
        prompt,
        choices,
        model: model.name.clone(),
        dry_run,
    };
    match state.service.route(request).await {
        Ok(Ok(mut routed)) => {
            routed.verdict.steering_free = steering_free;
            routed.verdict.model = model.name.clone();
            // Only a disaggregated TensorRT-LLM verdict has legs to carry it.
            routed.verdict.disagg_request_id = model.disagg_request_id
                && routed.verdict.mode == RouteMode::Disagg
                && routed.verdict.engine == Engine::Trtllm;
            Ok(Decided {
                routed,
                model: model.name.clone(),
                dry_run,
            })
        }
        Ok(Err(RouteError::NoDecodeWorkers)) => Err(fail(RouteFailure::NoWorkers)),
        Err(_) => Err(fail(RouteFailure::Unavailable)),
    }
}

/// The handler.
pub async fn handle<S, B>(query: String, headers: HeaderMap, body: S, state: ApiState) -> Response
where
    S: futures::Stream<Item = Result<B, warp::Error>> + Send,
    B: warp::Buf,
{
    let started = Instant::now();
    let result = decide(&query, &headers, body, &state).await;
    let m = &state.metrics;
    match result {
        Ok(Decided {
            routed,
            dry_run: true,
            ..
        }) => {
            // Shown, not decided: none of a decision's figures or records.
            m.route_dry_runs.inc();
            let verdict = &routed.verdict;
            tracing::debug!(
                request_id = %verdict.request_id,
                mode = verdict.mode.as_str(),
                reason = verdict.reason.as_str(),
                decode = %verdict.decode.worker_id.0,
                "dry run"
            );
            warp::reply::with_header(warp::reply::json(&routed.verdict), DRY_RUN_HEADER, "true")
                .into_response()
        }
        Ok(Decided {
            routed,
            model,
            dry_run: false,
        }) => {
            // Verdicts only: a refusal is quick, and counting it would pull the figure an
            // operator reads as "what routing costs a request" below what it costs.
            m.route_latency_seconds
                .observe(started.elapsed().as_secs_f64());
            let record = DecisionRecord::of(&routed, model.clone(), state.now_ms());
            state.recent().record(record);
            let verdict = routed.verdict;
            tracing::debug!(
                request_id = %verdict.request_id,
                mode = verdict.mode.as_str(),
                reason = verdict.reason.as_str(),
                decode = %verdict.decode.worker_id.0,
                prefill = verdict.prefill.as_ref().map_or("-", |p| p.worker_id.0.as_str()),
                isl = verdict.isl,
                cached_tokens = verdict.cached_tokens,
                "verdict"
            );
            m.decisions
                .get_or_create(&DecisionLabels::of(verdict.mode, verdict.reason))
                .inc();
            if let Some(model) = model {
                m.model_decisions
                    .get_or_create(&ModelDecisionLabels {
                        model,
                        mode: verdict.mode.as_str(),
                        reason: verdict.reason.as_str(),
                    })
                    .inc();
            }
            m.eff_isl_tokens.observe(f64::from(verdict.eff_isl));
            if verdict.isl > 0 {
                m.cached_fraction.observe(
                    f64::from(verdict.cached_tokens.min(verdict.isl)) / f64::from(verdict.isl),
                );
            }
            warp::reply::json(&verdict).into_response()
        }
        Err((code, reply)) => {
            m.bad_request(code);
            tracing::debug!(
                code,
                request_id = headers
                    .get(REQUEST_ID_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-"),
                "route request refused"
            );
            reply
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_asks_for_a_dry_run_or_is_refused() {
        for (query, want) in [
            ("", false),
            ("dry_run=true", true),
            ("dry_run=1", true),
            ("dry_run=false", false),
            ("dry_run=0", false),
            ("&dry_run=true&", true),
        ] {
            assert_eq!(dry_run(query), Ok(want), "{query}");
        }
        for (query, mentions) in [
            ("dry_run", "got \"\""),
            ("dry_run=yes", "\"yes\""),
            ("dryrun=true", "\"dryrun\""),
            ("dry_run=true&dry_run=false", "twice"),
            ("dry_run=true&n=2", "\"n\""),
        ] {
            let err = dry_run(query).unwrap_err();
            assert_eq!(err.status_and_code().1, "bad_query", "{query}");
            assert!(err.to_string().contains(mentions), "{query}: {err}");
        }
    }

    #[test]
    fn api_header_is_required_and_checked() {
        let mut h = HeaderMap::new();
        assert!(matches!(api_kind(&h), Err(RouteFailure::UnknownApi(_))));
        h.insert(API_HEADER, "embeddings".parse().unwrap());
        let err = api_kind(&h).unwrap_err();
        assert!(err.to_string().contains("embeddings"));
        assert_eq!(err.status_and_code().1, "unknown_api");
        h.insert(API_HEADER, "chat".parse().unwrap());
        assert_eq!(api_kind(&h).unwrap(), ApiKind::Chat);
    }

    #[test]
    fn the_route_input_is_the_body_unless_the_header_says_hashes() {
        let mut h = HeaderMap::new();
        assert_eq!(route_input(&h).unwrap(), RouteInput::Body);
        h.insert(ROUTE_INPUT_HEADER, "hashes".parse().unwrap());
        assert_eq!(route_input(&h).unwrap(), RouteInput::Hashes);
        h.insert(ROUTE_INPUT_HEADER, "tokens".parse().unwrap());
        let err = route_input(&h).unwrap_err();
        assert!(err.to_string().contains("tokens"), "{err}");
        assert_eq!(
            err.status_and_code(),
            (StatusCode::BAD_REQUEST, "bad_route_input")
        );
    }

    #[test]
    fn request_ids_are_kept_or_made_up() {
        let ids = RequestIds::new("t");
        let mut h = HeaderMap::new();
        let a = request_id(&h, &ids).unwrap();
        let b = request_id(&h, &ids).unwrap();
        assert_ne!(a, b);
        h.insert(REQUEST_ID_HEADER, "abc".parse().unwrap());
        assert_eq!(request_id(&h, &ids).unwrap(), "abc");
        h.insert(
            REQUEST_ID_HEADER,
            "x".repeat(MAX_REQUEST_ID_LEN).parse().unwrap(),
        );
        assert!(
            request_id(&h, &ids).is_ok(),
            "the filter forwards ids this long"
        );
        h.insert(
            REQUEST_ID_HEADER,
            "x".repeat(MAX_REQUEST_ID_LEN + 1).parse().unwrap(),
        );
        assert!(request_id(&h, &ids).is_err());
        h.insert(REQUEST_ID_HEADER, "a b".parse().unwrap());
        assert!(request_id(&h, &ids).is_err());
    }

    #[test]
    fn an_unknown_model_is_openais_404_with_the_reject_header() {
        let failure = RouteFailure::UnknownModel("x".into());
        assert_eq!(
            failure.status_and_code(),
            (StatusCode::NOT_FOUND, "unknown_model")
        );
        let reply = failure.into_reply();
        assert_eq!(reply.status(), StatusCode::NOT_FOUND);
        assert_eq!(
            reply.headers().get(REJECT_HEADER).unwrap(),
            RejectReason::UnknownModel.as_str()
        );
        assert_eq!(
            model_not_found("x").to_string(),
            r#"{"error":{"message":"The model `x` does not exist.","type":"invalid_request_error","param":"model","code":"model_not_found"}}"#
        );
    }
}
