//! The REST API (warp), on two listeners: the route API for Envoy and the admin API for
//! operators.
//!
//! | listener | method | path | what |
//! |---|---|---|---|
//! | route | POST | `/v1/route` | client's OpenAI body verbatim → [`Verdict`](switchyard_protocol::route::Verdict) |
//! | route | POST | `/v1/lifecycle` | [`LifecycleBatch`](switchyard_protocol::lifecycle::LifecycleBatch) from the filter |
//! | route | POST | `/v3/discovery:endpoints` | Envoy REST EDS (see [`crate::eds`]) |
//! | admin, token | GET | `/v1/workers` | live workers |
//! | admin, token | GET, PUT | `/v1/config` | conditional-disaggregation policy |
//! | admin, token | GET | `/v1/status` | workers, config, recent verdicts and the bypass share over time |
//! | admin | GET | `/` | the status page (HTML; it asks for `/v1/status` with the token) |
//! | admin | GET | `/whatif/<file>` | the page's what-if module, JS and wasm ([`whatif`]) |
//! | both | GET | `/metrics` | Prometheus / OpenMetrics text |
//! | both | GET, HEAD | `/healthz` | liveness (200 while HTTP serves, NATS state included) |
//! | both | GET, HEAD | `/readyz` | readiness for route calls (503 naming what is awaited; see [`crate::readiness`]) |
//!
//! The route API is unauthenticated: Envoy's filter calls it on every request. The admin
//! endpoints that change or dump state need the admin bearer token ([`auth`]).
//!
//! Every error is an [`ApiError`] `{code, message}` with a status callers can act on, and is
//! counted by code. Handlers never panic on input.

pub mod admin;
pub mod auth;
pub mod route;
pub mod tokenize_lanes;
pub mod tokenizer_bundle;
pub mod whatif;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use prometheus_client::registry::Registry;
use warp::http::StatusCode;
use warp::reply::Response;
use warp::{Filter, Reply};

use switchyard_protocol::route::ApiError;
use switchyard_support::http_server;

use crate::metrics::Metrics;
use crate::models::Models;
use crate::service::tokenizer::SegmentCacheStats;
use crate::service::ServiceHandle;

/// Largest body accepted by the small JSON endpoints (lifecycle, config, EDS).
pub const MAX_SMALL_BODY_BYTES: usize = 1024 * 1024;

/// What every handler shares. Cheap to clone.
#[derive(Clone)]
pub struct ApiState {
    /// The router owner.
    pub service: ServiceHandle,
    /// The models served, each with its tokenizer (called on blocking threads) and context
    /// length: longer prompts and larger `max_tokens` are refused.
    pub models: Arc<Models>,
    /// Bounds concurrent tokenizations (`--route-tokenize-threads` per lane).
    pub tokenize_lanes: tokenize_lanes::TokenizeLanes,
    /// Metric handles.
    pub metrics: Metrics,
    /// Registry rendered by `/metrics`.
    pub registry: Arc<Registry>,
    /// NATS client, for health and the `nats_connected` gauge.
    pub nats: async_nats::Client,
    /// `--max-route-body-bytes`.
    pub max_route_body_bytes: usize,
    /// Makes ids for route requests that arrive without `x-request-id`.
    pub request_ids: Arc<route::RequestIds>,
    /// Tokenizer cache counters already folded into the metrics.
    pub cache_stats_seen: Arc<Mutex<SegmentCacheStats>>,
    /// Shut while the declared workers' first health polls are pending: EDS answers 503 then.
    pub first_polls: crate::pools::first_polls::FirstPolls,
    /// The admin API's bearer token; `None` closes the admin endpoints.
    pub admin_token: Option<auth::AdminToken>,
    /// The last verdicts and the bypass share, for the status page.
    pub recent: Arc<Mutex<crate::status::RecentDecisions>>,
    /// The service's start, the zero of the status page's times.
    pub started: tokio::time::Instant,
    /// When NATS connected, and whether `/readyz` said ready before.
    pub readiness: crate::readiness::Readiness,
    /// Whether readiness waits for NATS (workers register over it, or replicas share state).
    pub needs_nats: bool,
    /// `--ready-after-ms`.
    pub ready_after_ms: u64,
    /// `--replica-id`: with one, the router config is shared with the other replicas (`PUT
    /// /v1/config` writes the shared config), and `/v1/status` names the replica.
    pub replica_id: Option<String>,
    /// `--whatif-dir`: the status page's what-if module.
    pub whatif_dir: whatif::WhatIfDir,
}

impl ApiState {
    /// Milliseconds since the service started: the status page's clock.
    pub fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The recent verdicts, whatever a panicking holder left behind (the data is plain).
    pub fn recent(&self) -> std::sync::MutexGuard<'_, crate::status::RecentDecisions> {
        self.recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A JSON error reply, counted under its code by the caller.
pub fn error_reply(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = ApiError {
        code: code.to_string(),
        message: message.into(),
    };
    warp::reply::with_status(warp::reply::json(&body), status).into_response()
}

fn with_state(state: ApiState) -> impl Filter<Extract = (ApiState,), Error = Infallible> + Clone {
    warp::any().map(move || state.clone())
}

/// The route listener's endpoints (for Envoy), with unmatched paths and methods answered as
/// [`ApiError`] JSON.
pub fn route_api(
    state: ApiState,
) -> impl Filter<Extract = (Response,), Error = Infallible> + Clone {
    let counted = unmatched(state.metrics.clone());
    let route = warp::path!("v1" / "route")
        .and(warp::post())
        .and(warp::query::raw().or(warp::any().map(String::new)).unify())
        .and(warp::header::headers_cloned())
        .and(warp::body::stream())
        .and(with_state(state.clone()))
        .then(route::handle);
    let lifecycle = warp::path!("v1" / "lifecycle")
        .and(warp::post())
        .and(warp::body::stream())
        .and(with_state(state.clone()))
        .then(admin::lifecycle);
    let eds = warp::path!("v3" / "discovery:endpoints")
        .and(warp::post())
        .and(warp::body::stream())
        .and(with_state(state.clone()))
        .then(admin::eds);
    let tokenizer = warp::path!("v1" / "tokenizer")
        .and(warp::get())
        .and(warp::header::headers_cloned())
        .and(with_state(state.clone()))
        .then(tokenizer_bundle::handle);
    // Callers of the admin endpoints on this listener are told where they went.
    let moved = (warp::path!("v1" / "config")
        .or(warp::path!("v1" / "workers"))
        .unify()
        .or(warp::path!("v1" / "status"))
        .unify())
    .and(with_state(state.clone()))
    .map(misdirected(
        "admin_listener",
        "the admin endpoints are served on the admin listener (--admin-listen), not on the route listener",
    ));
    // So is a client pointed at the control plane instead of the gateway.
    let inference = (warp::path!("v1" / "chat" / "completions")
        .or(warp::path!("v1" / "completions"))
        .unify())
    .and(with_state(state.clone()))
    .map(misdirected(
        "not_the_gateway",
        "this is the Switchyard control plane's route API, which the gateway's filter calls: send chat and completion requests to the gateway (Envoy's listener)",
    ));
    let answered = route
        .or(lifecycle)
        .unify()
        .or(inference)
        .unify()
        .or(tokenizer)
        .unify()
        .or(eds)
        .unify()
        .or(moved)
        .unify()
        .or(observability(state))
        .unify()
        .recover(counted)
        .unify();
    http_server::with_allow(ROUTE_ENDPOINTS, answered)
}

/// The route listener's endpoints and their methods, for a 405's `Allow` header.
pub const ROUTE_ENDPOINTS: http_server::Endpoints = &[
    ("/v1/route", "POST"),
    ("/v1/lifecycle", "POST"),
    ("/v3/discovery:endpoints", "POST"),
    ("/v1/tokenizer", "GET"),
    ("/metrics", "GET"),
    ("/healthz", "GET, HEAD"),
    ("/readyz", "GET, HEAD"),
];

/// The admin listener's endpoints and their methods, for a 405's `Allow` header.
pub const ADMIN_ENDPOINTS: http_server::Endpoints = &[
    ("/v1/workers", "GET"),
    ("/v1/config", "GET, PUT"),
    ("/v1/status", "GET"),
    ("/", "GET"),
    ("/whatif/*", "GET"),
    ("/metrics", "GET"),
    ("/healthz", "GET, HEAD"),
    ("/readyz", "GET, HEAD"),
];

/// The admin listener's endpoints (for operators): the runtime config, the worker list and the
/// status behind the admin token; the status page, its what-if module, metrics and health
/// without it.
pub fn admin_api(
    state: ApiState,
) -> impl Filter<Extract = (Response,), Error = Infallible> + Clone {
    let counted = unmatched(state.metrics.clone());
    let workers = warp::path!("v1" / "workers")
        .and(warp::get())
        .and(warp::header::headers_cloned())
        .and(with_state(state.clone()))
        .then(admin::workers);
    let get_config = warp::path!("v1" / "config")
        .and(warp::get())
        .and(warp::header::headers_cloned())
        .and(with_state(state.clone()))
        .then(admin::get_config);
    let put_config = warp::path!("v1" / "config")
        .and(warp::put())
        .and(warp::header::headers_cloned())
        .and(warp::body::stream())
        .and(with_state(state.clone()))
        .then(admin::put_config);
    let status = warp::path!("v1" / "status")
        .and(warp::get())
        .and(warp::header::headers_cloned())
        .and(with_state(state.clone()))
        .then(admin::status);
    let page = warp::path::end().and(warp::get()).map(|| {
        warp::reply::with_header(
            admin::STATUS_PAGE,
            "content-type",
            "text/html; charset=utf-8",
        )
        .into_response()
    });
    let whatif = warp::path!("whatif" / String)
        .and(warp::get())
        .and(with_state(state.clone()))
        .then(whatif::file);
    let answered = workers
        .or(get_config)
        .unify()
        .or(put_config)
        .unify()
        .or(status)
        .unify()
        .or(page)
        .unify()
        .or(whatif)
        .unify()
        .or(observability(state))
        .unify()
        .recover(counted)
        .unify();
    http_server::with_allow(ADMIN_ENDPOINTS, answered)
}

/// `/metrics` and `/healthz`, on both listeners: Prometheus scrapes and liveness probes reach
/// whichever one they are given.
fn observability(
    state: ApiState,
) -> impl Filter<Extract = (Response,), Error = warp::Rejection> + Clone {
    let metrics = warp::path!("metrics")
        .and(warp::get())
        .and(with_state(state.clone()))
        .then(admin::metrics);
    // HEAD too: some probes and load balancers check with it (hyper sends no body).
    let get_or_head = || warp::get().or(warp::head()).unify();
    let health = warp::path!("healthz")
        .and(get_or_head())
        .and(with_state(state.clone()))
        .then(admin::health);
    let ready = warp::path!("readyz")
        .and(get_or_head())
        .and(with_state(state))
        .then(admin::ready);
    metrics.or(health).unify().or(ready).unify()
}

/// A 404 for a request sent to the wrong place, saying where it belongs, counted as a bad
/// request under `code`.
fn misdirected(code: &'static str, message: &'static str) -> impl Fn(ApiState) -> Response + Clone {
    move |state: ApiState| {
        state.metrics.bad_request(code);
        error_reply(StatusCode::NOT_FOUND, code, message)
    }
}

/// Answers a request no endpoint took (unknown path, wrong method, a header or body warp
/// could not read), counted like every other refused request.
fn unmatched(
    metrics: Metrics,
) -> impl Fn(warp::Rejection) -> std::future::Ready<Result<Response, Infallible>> + Clone {
    move |rejection: warp::Rejection| {
        let (status, code, message) = if rejection.is_not_found() {
            (
                StatusCode::NOT_FOUND,
                "not_found",
                "no such endpoint".to_owned(),
            )
        } else if rejection.find::<warp::reject::MethodNotAllowed>().is_some() {
            (
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "method not allowed on this endpoint".to_owned(),
            )
        } else {
            (
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("{rejection:?}"),
            )
        };
        metrics.bad_request(code);
        std::future::ready(Ok(error_reply(status, code, message)))
    }
}

/// The body length a request declares (`content-length`), 0 when absent or unreadable.
pub fn declared_length(headers: &warp::http::HeaderMap) -> usize {
    headers
        .get(warp::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0)
}

/// How long a request's body may take to arrive once its headers have. Envoy sends a route
/// call's buffered body at once (megabytes in milliseconds over loopback); a peer that stops
/// midway would otherwise hold its connection, task and buffer for ever.
pub const BODY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Reads a request body, refusing more than `limit` bytes (413) whatever the declared
/// length, so a chunked upload cannot grow without bound, and a body that has not arrived
/// within [`BODY_READ_TIMEOUT`] (408). `declared` (see [`declared_length`]), when within the
/// limit, sizes the buffer up front: agentic bodies are 0.4–1 MB, and growing a buffer by
/// doubling copies the body about twice more.
///
/// # Errors
/// `Err(reply)` with 413 `body_too_large`, 408 `body_read_timeout` or 400 `body_read`.
pub async fn read_body<S, B>(
    body: S,
    limit: usize,
    declared: usize,
) -> Result<Vec<u8>, (&'static str, Response)>
where
    S: futures::Stream<Item = Result<B, warp::Error>> + Send,
    B: warp::Buf,
{
    match tokio::time::timeout(BODY_READ_TIMEOUT, read_body_within(body, limit, declared)).await {
        Ok(read) => read,
        Err(_) => {
            let code = "body_read_timeout";
            Err((
                code,
                error_reply(
                    StatusCode::REQUEST_TIMEOUT,
                    code,
                    format!(
                        "the request body did not arrive within {} s",
                        BODY_READ_TIMEOUT.as_secs()
                    ),
                ),
            ))
        }
    }
}

/// [`read_body`] without its time bound.
async fn read_body_within<S, B>(
    body: S,
    limit: usize,
    declared: usize,
) -> Result<Vec<u8>, (&'static str, Response)>
where
    S: futures::Stream<Item = Result<B, warp::Error>> + Send,
    B: warp::Buf,
{
    use futures::StreamExt;
    let mut body = std::pin::pin!(body);
    let mut buf = Vec::with_capacity(declared.min(limit));
    while let Some(chunk) = body.next().await {
        let mut chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                let code = "body_read";
                return Err((
                    code,
                    error_reply(StatusCode::BAD_REQUEST, code, e.to_string()),
                ));
            }
        };
        if buf.len() + chunk.remaining() > limit {
            let code = "body_too_large";
            return Err((
                code,
                error_reply(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    code,
                    format!("request body exceeds {limit} bytes"),
                ),
            ));
        }
        while chunk.has_remaining() {
            let part = chunk.chunk();
            buf.extend_from_slice(part);
            let n = part.len();
            chunk.advance(n);
        }
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body that stops arriving midway is refused once its time is up (a peer that
    /// stalls would otherwise hold the connection and its buffer for ever).
    #[tokio::test(start_paused = true)]
    async fn a_body_that_stops_arriving_is_refused_when_its_time_is_up() {
        let first = futures::stream::iter([Ok::<_, warp::Error>(bytes::Bytes::from_static(
            b"{\"model\":",
        ))]);
        let stalled = futures::StreamExt::chain(first, futures::stream::pending());
        let started = tokio::time::Instant::now();
        let (code, reply) = read_body(stalled, 1 << 20, 100).await.unwrap_err();
        assert_eq!(code, "body_read_timeout");
        assert_eq!(reply.status(), StatusCode::REQUEST_TIMEOUT);
        assert_eq!(started.elapsed(), BODY_READ_TIMEOUT);
        // A whole body is read as before.
        let whole = futures::stream::iter([Ok::<_, warp::Error>(bytes::Bytes::from_static(b"{}"))]);
        assert_eq!(read_body(whole, 1 << 20, 2).await.unwrap(), b"{}");
    }
}
