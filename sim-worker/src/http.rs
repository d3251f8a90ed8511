//! The worker's HTTP API (warp): vLLM's OpenAI endpoints, `/health`, `/metrics`, and the KV
//! pull side channel. Every response carries `x-switchyard-worker: <id>`.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use serde_json::json;
use switchyard_protocol::openai::{is_json_content_type, not_json_content_type_error};
use switchyard_protocol::route::{ApiKind, REQUEST_ID_HEADER};
use warp::http::StatusCode;
use warp::reply::Response;
use warp::{Filter, Rejection, Reply};

use super::completion::{self, Answer};
use super::context::WorkerContext;
use super::error::ApiError;
use super::handoff::{parse_hold_id, PullRequest, PullResponse};
use super::legs::parse_room_hold_id;
use switchyard_engine::HeldKv;
use switchyard_protocol::hash::SequenceHash;
use switchyard_support::http_server;

/// Header naming the worker that served a response.
pub const WORKER_HEADER: &str = "x-switchyard-worker";
/// Largest request body accepted (long agentic prompts run to megabytes).
pub const MAX_BODY_BYTES: u64 = 64 << 20;

/// Every endpoint of a worker and its methods, for a 405's `Allow` header.
pub const ENDPOINTS: http_server::Endpoints = &[
    ("/v1/chat/completions", "POST"),
    ("/v1/completions", "POST"),
    ("/v1/models", "GET"),
    ("/health", "GET"),
    ("/metrics", "GET"),
    ("/switchyard/kv/pull", "POST"),
    ("/switchyard/kv/release", "POST"),
];

/// Every route of one worker.
pub fn routes(
    ctx: Arc<WorkerContext>,
) -> impl Filter<Extract = (impl Reply,), Error = Infallible> + Clone + Send + Sync + 'static {
    let with_ctx = {
        let ctx = ctx.clone();
        warp::any().map(move || ctx.clone())
    };
    let body = json_body(MAX_BODY_BYTES);
    let chat = warp::path!("v1" / "chat" / "completions")
        .and(warp::post())
        .and(with_ctx.clone())
        .and(warp::header::optional::<String>(REQUEST_ID_HEADER))
        .and(body.clone())
        .then(|ctx, rid, body| completion_reply(ctx, ApiKind::Chat, rid, body));
    let completions = warp::path!("v1" / "completions")
        .and(warp::post())
        .and(with_ctx.clone())
        .and(warp::header::optional::<String>(REQUEST_ID_HEADER))
        .and(body)
        .then(|ctx, rid, body| completion_reply(ctx, ApiKind::Completions, rid, body));
    let models = warp::path!("v1" / "models")
        .and(warp::get())
        .and(with_ctx.clone())
        .map(|ctx: Arc<WorkerContext>| models_reply(&ctx));
    // 200 only while the engine runs: a pool that polls /health must not keep routing to a
    // worker whose HTTP server outlived its engine.
    let health = warp::path!("health")
        .and(warp::get())
        .and(with_ctx.clone())
        .map(|ctx: Arc<WorkerContext>| {
            if ctx.engine.is_running() {
                StatusCode::OK.into_response()
            } else {
                StatusCode::SERVICE_UNAVAILABLE.into_response()
            }
        });
    let metrics = warp::path!("metrics")
        .and(warp::get())
        .and(with_ctx.clone())
        .map(|ctx: Arc<WorkerContext>| {
            let text = ctx.metrics.render(
                &ctx.model_name,
                &ctx.id.0,
                &ctx.engine.load(),
                ctx.engine_config.block_size,
            );
            warp::reply::with_header(text, "content-type", "text/plain; version=0.0.4")
                .into_response()
        });
    let pull = warp::path!("switchyard" / "kv" / "pull")
        .and(warp::post())
        .and(with_ctx.clone())
        .and(limited_body(64 << 10))
        .then(pull_reply);
    let release = warp::path!("switchyard" / "kv" / "release")
        .and(warp::post())
        .and(with_ctx.clone())
        .and(limited_body(64 << 10))
        .then(release_reply);
    let worker_id = ctx.id.0.clone();
    let recover_ctx = ctx;
    let answered = chat
        .or(completions)
        .unify()
        .or(models)
        .unify()
        .or(health)
        .unify()
        .or(metrics)
        .unify()
        .or(pull)
        .unify()
        .or(release)
        .unify()
        .recover(move |rejection| recover(recover_ctx.clone(), rejection))
        .unify();
    http_server::with_allow(ENDPOINTS, answered)
        .with(warp::reply::with::header(WORKER_HEADER, worker_id))
}

async fn completion_reply(
    ctx: Arc<WorkerContext>,
    api: ApiKind,
    request_id: Option<String>,
    body: Result<Bytes, ApiError>,
) -> Response {
    let served = match body {
        Ok(body) => completion::serve(ctx.clone(), api, request_id.clone(), body).await,
        Err(e) => Err(e),
    };
    let mut response = match served {
        Ok(Answer::Json(value)) => warp::reply::json(&value).into_response(),
        Ok(Answer::Stream(stream)) => {
            let reply = warp::reply::stream(stream);
            let reply = warp::reply::with_header(reply, "content-type", "text/event-stream");
            warp::reply::with_header(reply, "cache-control", "no-cache").into_response()
        }
        Err(e) => error_reply(&ctx, &e),
    };
    // Echo the shared request id, as vLLM does, so both legs of a request can be correlated.
    if let Some(value) = request_id.and_then(|r| warp::http::HeaderValue::from_str(&r).ok()) {
        response.headers_mut().insert(REQUEST_ID_HEADER, value);
    }
    response
}

fn models_reply(ctx: &WorkerContext) -> Response {
    let body = json!({
        "object": "list",
        "data": [{
            "id": ctx.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "switchyard-sim",
            "root": ctx.model_name,
            "parent": null,
            "max_model_len": ctx.max_model_len,
        }],
    });
    warp::reply::json(&body).into_response()
}

/// Releases the hold a side-channel request names; the shared first half of pull and
/// release.
/// Why a hold could not be taken.
enum TakeHoldError {
    /// A hold id of this worker under which nothing is held (any more): pulled, released or
    /// expired; or an SGLang room not held yet.
    Gone(ApiError),
    /// Anything else: a bad request, another worker's id, a worker shutting down.
    Refused(ApiError),
}

impl TakeHoldError {
    fn into_api_error(self) -> ApiError {
        match self {
            TakeHoldError::Gone(e) | TakeHoldError::Refused(e) => e,
        }
    }
}

async fn take_hold(
    ctx: &WorkerContext,
    body: Result<Bytes, ApiError>,
) -> Result<(PullRequest, HeldKv, Option<SequenceHash>), TakeHoldError> {
    let refused = TakeHoldError::Refused;
    let body = body.map_err(refused)?;
    let req: PullRequest = switchyard_protocol::from_json_object(&body).map_err(|e| {
        refused(ApiError::bad_request(
            format!("invalid hold request (want {{\"remote_request_id\"}}): {e}"),
            None,
        ))
    })?;
    let not_held = || ApiError::not_found(format!("no KV held under {:?}", req.remote_request_id));
    let id = match parse_hold_id(&req.remote_request_id, &ctx.id.0, ctx.instance_id) {
        Some(id) => id,
        None => match parse_room_hold_id(&req.remote_request_id) {
            // A room the prefill leg, which runs at the same time, may not hold yet.
            Some(room) => ctx
                .holds
                .take_room(room)
                .ok_or_else(|| TakeHoldError::Gone(not_held()))?,
            None => return Err(refused(not_held())),
        },
    };
    // Forget the record whatever the engine says: an expired hold is gone either way.
    let prefix_hash = ctx.holds.take(id).flatten();
    match ctx.engine.release_held(id).await {
        Ok(Some(held)) => Ok((req, held, prefix_hash)),
        Ok(None) => Err(TakeHoldError::Gone(not_held())),
        Err(_) => Err(refused(ApiError::unavailable(
            "the worker is shutting down",
        ))),
    }
}

async fn pull_reply(ctx: Arc<WorkerContext>, body: Result<Bytes, ApiError>) -> Response {
    match take_hold(&ctx, body).await {
        Ok((req, held, prefix_hash)) => {
            ctx.metrics.kv_holds_pulled.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(worker = %ctx.id, hold = %req.remote_request_id, requester = %req.requester, "KV pulled");
            let body = PullResponse {
                worker_id: ctx.id.0.clone(),
                prompt_tokens: held.prompt_tokens,
                block_ids: held.block_ids,
                prefix_hash,
            };
            warp::reply::json(&body).into_response()
        }
        // Nothing held (yet): part of the handoff, not a bad request. An SGLang decode worker
        // asks for its room until the prefill leg, which runs at the same time, holds it.
        Err(TakeHoldError::Gone(e)) => uncounted_error_reply(&e),
        Err(e) => error_reply(&ctx, &e.into_api_error()),
    }
}

/// `POST /switchyard/kv/release`: the gateway gives up a hold whose decode leg will never
/// come (the client left, or the decode worker refused the request), so its blocks are free
/// now instead of at the end of the lease.
async fn release_reply(ctx: Arc<WorkerContext>, body: Result<Bytes, ApiError>) -> Response {
    match take_hold(&ctx, body).await {
        Ok((req, _, _)) => {
            ctx.metrics
                .kv_holds_released
                .fetch_add(1, Ordering::Relaxed);
            tracing::debug!(worker = %ctx.id, hold = %req.remote_request_id, "KV released unpulled");
            warp::reply::json(&json!({"released": req.remote_request_id})).into_response()
        }
        // Nothing held under this worker's id: the decode worker pulled it already (the
        // gateway cannot tell, for a non-streamed request whose client left mid-decode), or
        // it expired. Releasing asks that nothing stay held, which is so: not an error.
        Err(TakeHoldError::Gone(e)) => {
            tracing::debug!(worker = %ctx.id, "release of a hold already gone: {}", e.message);
            warp::reply::json(&json!({"released": null})).into_response()
        }
        Err(e) => error_reply(&ctx, &e.into_api_error()),
    }
}

/// The body of a request to an OpenAI endpoint ([`limited_body`]), refused when its
/// `content-type` is not `application/json`, as vLLM refuses it (vLLM before reading the
/// body; the simulated worker reads it first, which changes no answer).
fn json_body(
    limit: u64,
) -> impl Filter<Extract = (Result<Bytes, ApiError>,), Error = Rejection> + Clone {
    warp::header::headers_cloned().and(limited_body(limit)).map(
        |headers: warp::http::HeaderMap, body| {
            let content_type = headers.get("content-type").map(|v| v.as_bytes());
            if is_json_content_type(content_type) {
                body
            } else {
                Err(ApiError::bad_request(
                    not_json_content_type_error(content_type),
                    None,
                ))
            }
        },
    )
}

/// The request body, up to `limit` bytes. Unlike warp's `content_length_limit`, chunked bodies
/// (no `content-length`, as Envoy sends a body a filter rewrote) are accepted, as vLLM's
/// server accepts them; the limit is enforced while reading.
fn limited_body(
    limit: u64,
) -> impl Filter<Extract = (Result<Bytes, ApiError>,), Error = Rejection> + Clone {
    warp::header::optional::<u64>("content-length")
        .and(warp::body::stream())
        .then(move |declared: Option<u64>, body| read_limited(declared, body, limit))
}

async fn read_limited<S, B>(declared: Option<u64>, body: S, limit: u64) -> Result<Bytes, ApiError>
where
    S: futures::Stream<Item = Result<B, warp::Error>>,
    B: warp::Buf,
{
    let too_large = || ApiError::payload_too_large(limit);
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let mut body = std::pin::pin!(body);
    let mut out = bytes::BytesMut::with_capacity(declared.unwrap_or(0) as usize);
    while let Some(chunk) = body.next().await {
        let mut chunk =
            chunk.map_err(|e| ApiError::bad_request(format!("cannot read the body: {e}"), None))?;
        if (out.len() + chunk.remaining()) as u64 > limit {
            return Err(too_large());
        }
        while chunk.has_remaining() {
            let piece = chunk.chunk();
            out.extend_from_slice(piece);
            let n = piece.len();
            chunk.advance(n);
        }
    }
    Ok(out.freeze())
}

/// Turns warp's rejections into OpenAI-style errors.
async fn recover(ctx: Arc<WorkerContext>, rejection: Rejection) -> Result<Response, Infallible> {
    let error = if rejection.is_not_found() {
        ApiError::not_found("no such route")
    } else if rejection.find::<warp::reject::MethodNotAllowed>().is_some() {
        ApiError::method_not_allowed()
    } else {
        ApiError::bad_request(format!("bad request: {rejection:?}"), None)
    };
    Ok(error_reply(&ctx, &error))
}

fn error_reply(ctx: &WorkerContext, error: &ApiError) -> Response {
    if (400..500).contains(&error.status) {
        ctx.metrics.bad_requests.fetch_add(1, Ordering::Relaxed);
    }
    uncounted_error_reply(error)
}

/// An error answer that is not the asker's mistake (not counted as a bad request).
fn uncounted_error_reply(error: &ApiError) -> Response {
    let status = StatusCode::from_u16(error.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    warp::reply::with_status(warp::reply::json(&error.to_json()), status).into_response()
}
