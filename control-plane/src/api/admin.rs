//! The small endpoints: lifecycle, workers, config, EDS, metrics, health.

use warp::http::{HeaderMap, StatusCode};
use warp::reply::Response;
use warp::Reply;

use switchyard_protocol::lifecycle::{LifecycleBatch, LifecycleEvent};
use switchyard_protocol::route::{is_usable_request_id, MAX_REQUEST_ID_LEN};

use super::auth::{authorize, Refusal};
use super::{error_reply, read_body, ApiState, MAX_SMALL_BODY_BYTES};
use crate::config_version::{etag, IfMatch, PatchRefusal};
use crate::eds::{self, DiscoveryRequest};

fn unavailable(state: &ApiState) -> Response {
    state.metrics.bad_request("unavailable");
    error_reply(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "the control plane is shutting down",
    )
}

/// The admin token check every admin endpoint runs first: `Some` is the refusal to send
/// (401 with `WWW-Authenticate`, or 403), counted.
fn refused(state: &ApiState, headers: &HeaderMap) -> Option<Response> {
    let header = headers
        .get(warp::http::header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    authorize(state.admin_token.as_ref(), header)
        .err()
        .map(|refusal| {
            state.metrics.admin_refused(refusal);
            let status = StatusCode::from_u16(refusal.status()).unwrap_or(StatusCode::FORBIDDEN);
            let reply = error_reply(status, refusal.code(), refusal.message());
            if refusal == Refusal::MissingToken {
                warp::reply::with_header(reply, "www-authenticate", "Bearer").into_response()
            } else {
                reply
            }
        })
}

/// Reads and parses a small JSON body, counting and answering failures.
async fn json_body<T, S, B>(body: S, state: &ApiState) -> Result<T, Response>
where
    T: serde::de::DeserializeOwned,
    S: futures::Stream<Item = Result<B, warp::Error>> + Send,
    B: warp::Buf,
{
    let bytes = match read_body(body, MAX_SMALL_BODY_BYTES, 0).await {
        Ok(b) => b,
        Err((code, reply)) => {
            state.metrics.bad_request(code);
            return Err(reply);
        }
    };
    switchyard_protocol::from_json_object(&bytes).map_err(|e| {
        state.metrics.bad_request("invalid_json");
        error_reply(StatusCode::BAD_REQUEST, "invalid_json", e.to_string())
    })
}

/// `POST /v1/lifecycle`.
pub async fn lifecycle<S, B>(body: S, state: ApiState) -> Response
where
    S: futures::Stream<Item = Result<B, warp::Error>> + Send,
    B: warp::Buf,
{
    let mut batch: LifecycleBatch = match json_body(body, &state).await {
        Ok(b) => b,
        Err(reply) => return reply,
    };
    if let Some(why) = switchyard_protocol::unsupported_version(batch.v) {
        state.metrics.bad_request("unsupported_version");
        return error_reply(StatusCode::BAD_REQUEST, "unsupported_version", why);
    }
    // Ids the route API would refuse can match no verdict, and a remembered failed-open id
    // holds its text for a minute: a long one is memory anyone could fill.
    if let Some(j) = batch
        .events
        .iter()
        .position(|e| e.request_id().is_some_and(|id| !is_usable_request_id(id)))
    {
        state.metrics.bad_request("invalid_request_id");
        return error_reply(
            StatusCode::BAD_REQUEST,
            "invalid_request_id",
            format!(
                "events[{j}].request_id: must be 1 to {MAX_REQUEST_ID_LEN} visible ASCII \
                 characters, as the route API takes"
            ),
        );
    }
    state.metrics.lifecycle_events(&batch.events);
    for event in &batch.events {
        tracing::debug!(
            request_id = event.request_id().unwrap_or("-"),
            event = event.kind(),
            "lifecycle"
        );
    }
    // Events of a kind this build does not know (a filter newer than this control plane) are
    // counted above as `unknown` and go no further: not to the router, not to the other
    // replicas. The batch's other events apply.
    let received = batch.events.len();
    batch
        .events
        .retain(|event| *event != LifecycleEvent::Unknown);
    let accepted = batch.events.len();
    if accepted < received {
        tracing::debug!(
            ignored = received - accepted,
            "lifecycle events of an unknown kind ignored (a newer filter?)"
        );
    }
    // A batch of unknown kinds only has nothing to apply: not worth the owner's turn, nor a
    // message to every replica, which would share their bounded queue with real updates.
    let applied = if batch.events.is_empty() {
        Ok(())
    } else {
        state.service.lifecycle(batch).await
    };
    match applied {
        Ok(()) => warp::reply::json(&serde_json::json!({
            "accepted": accepted,
            "ignored": received - accepted,
        }))
        .into_response(),
        Err(_) => unavailable(&state),
    }
}

/// `GET /v1/workers` (admin token).
pub async fn workers(headers: HeaderMap, state: ApiState) -> Response {
    if let Some(refusal) = refused(&state, &headers) {
        return refusal;
    }
    match state.service.workers().await {
        Ok(workers) => {
            warp::reply::json(&serde_json::json!({ "workers": workers })).into_response()
        }
        Err(_) => unavailable(&state),
    }
}

/// The status page: static HTML whose script fetches `GET /v1/status` with the admin token
/// (taken from the URL fragment or a form, so it never reaches a server log).
pub const STATUS_PAGE: &str = include_str!("status.html");

/// `GET /v1/status` (admin token): what the status page shows.
pub async fn status(headers: HeaderMap, state: ApiState) -> Response {
    if let Some(refusal) = refused(&state, &headers) {
        return refusal;
    }
    let (Ok(workers), Ok(config)) = (state.service.workers().await, state.service.config().await)
    else {
        return unavailable(&state);
    };
    let now_ms = state.now_ms();
    let decisions = state.recent().view(now_ms);
    warp::reply::json(&serde_json::json!({
        // Several replicas each show their own verdicts on their own clock: say whose.
        "replica": state.replica_id,
        "now_ms": now_ms,
        "workers": workers,
        "config": config,
        "decisions": decisions,
    }))
    .into_response()
}

/// `GET /v1/config` (admin token).
pub async fn get_config(headers: HeaderMap, state: ApiState) -> Response {
    if let Some(refusal) = refused(&state, &headers) {
        return refusal;
    }
    match state.service.versioned_config().await {
        Ok((config, version)) => with_version(warp::reply::json(&config).into_response(), version),
        Err(_) => unavailable(&state),
    }
}

/// The config's version as an `ETag` ([`crate::config_version`]).
fn with_version(reply: Response, version: u64) -> Response {
    warp::reply::with_header(reply, "etag", etag(version)).into_response()
}

/// A change that was not made (the config is unchanged), counted: 400 `invalid_config`
/// naming the field, or 412 `config_version_mismatch` with the current version's `ETag`.
fn refused_change(state: &ApiState, refusal: &PatchRefusal) -> Response {
    let (status, code) = match refusal {
        PatchRefusal::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid_config"),
        PatchRefusal::Stale { .. } => (StatusCode::PRECONDITION_FAILED, "config_version_mismatch"),
    };
    state.metrics.bad_request(code);
    let reply = error_reply(status, code, refusal.to_string());
    match refusal {
        PatchRefusal::Stale { current } => with_version(reply, *current),
        PatchRefusal::Invalid(_) => reply,
    }
}

/// `PUT /v1/config` (admin token): a JSON merge patch over the current config (absent
/// fields keep their value, `null` resets an optional one); answers the whole new config and
/// its `ETag`, or 400 `invalid_config` naming the field, or 412 `config_version_mismatch`
/// when `If-Match` names another version (config unchanged either way).
pub async fn put_config<S, B>(headers: HeaderMap, body: S, state: ApiState) -> Response
where
    S: futures::Stream<Item = Result<B, warp::Error>> + Send,
    B: warp::Buf,
{
    // Checked before the body is read: a refused caller costs no parsing.
    if let Some(refusal) = refused(&state, &headers) {
        return refusal;
    }
    let patch: serde_json::Value = match json_body(body, &state).await {
        Ok(c) => c,
        Err(reply) => return reply,
    };
    // A header that is not text names no version of ours: it matches nothing.
    let if_match = headers.get(warp::http::header::IF_MATCH).map(|value| {
        value
            .to_str()
            .ok()
            .and_then(IfMatch::parse)
            .unwrap_or(IfMatch::Versions(Vec::new()))
    });
    if state.replica_id.is_some() {
        let patched = crate::replicas::config_store::patch(
            &state.nats,
            &state.service,
            &patch,
            if_match.as_ref(),
        )
        .await;
        return match patched {
            Ok(Ok(v)) => with_version(warp::reply::json(&v.config).into_response(), v.version),
            Ok(Err(refusal)) => refused_change(&state, &refusal),
            Err(e) => {
                // Fails loudly: a change that reached one replica only would split the fleet.
                let code = "config_store_unavailable";
                state.metrics.bad_request(code);
                error_reply(StatusCode::SERVICE_UNAVAILABLE, code, e.to_string())
            }
        };
    }
    match state.service.patch_config(patch, if_match).await {
        Ok(Ok((config, version))) => {
            with_version(warp::reply::json(&config).into_response(), version)
        }
        Ok(Err(refusal)) => refused_change(&state, &refusal),
        Err(_) => unavailable(&state),
    }
}

/// Checks readiness every 100 ms until it is reached (and latched), so that it does not wait
/// for someone to ask: a control plane that was ready once stays so even if NATS is away when
/// EDS is first polled. Ends once ready or when the router owner stops.
pub async fn watch_readiness(state: ApiState) {
    loop {
        match readiness(&state).await {
            Ok(()) => {
                state.metrics.ready.set(1);
                // A stop may have come meanwhile (it sets the gauge to 0 after marking
                // itself): checked after the set, so whichever comes last, the gauge says 0.
                if state.readiness.is_stopping() {
                    state.metrics.ready.set(0);
                    return;
                }
                tracing::info!("ready for route calls");
                return;
            }
            Err(None) => return,
            Err(Some(_)) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
        }
    }
}

/// Whether this control plane is ready (see [`crate::readiness`]): `Err(None)` when the
/// router owner has stopped.
async fn readiness(state: &ApiState) -> Result<(), Option<crate::readiness::NotReady>> {
    if state.readiness.latched() {
        return Ok(());
    }
    let now = tokio::time::Instant::now();
    let dumps_pending = state.service.dumps_pending().await.map_err(|_| None)?;
    state
        .readiness
        .check(&crate::readiness::Facts {
            needs_nats: state.needs_nats,
            nats_connected_for_ms: state.readiness.nats_connected_for_ms(now),
            warmup_ms: state.ready_after_ms,
            dumps_pending,
            first_polls_done: state.first_polls.is_open(now),
        })
        .map_err(Some)
}

/// `GET /readyz`: 200 once this replica may be given route calls, else 503 naming what it
/// still waits for (see [`crate::readiness`]).
pub async fn ready(state: ApiState) -> Response {
    // A replica shutting down still serves route calls while Envoy's health check moves
    // them elsewhere (see `crate::readiness`).
    let now = if state.readiness.is_stopping() {
        Err(Some(crate::readiness::NotReady::Stopping))
    } else {
        readiness(&state).await
    };
    match now {
        // The gauge is set by `watch_readiness`, which sees the latch within 100 ms.
        Ok(()) => warp::reply::json(&serde_json::json!({ "ready": true })).into_response(),
        Err(None) => unavailable(&state),
        Err(Some(waiting)) => {
            let mut body = serde_json::to_value(waiting).unwrap_or_default();
            body["ready"] = false.into();
            warp::reply::with_status(warp::reply::json(&body), StatusCode::SERVICE_UNAVAILABLE)
                .into_response()
        }
    }
}

/// `POST /v3/discovery:endpoints` (Envoy REST EDS).
pub async fn eds<S, B>(body: S, state: ApiState) -> Response
where
    S: futures::Stream<Item = Result<B, warp::Error>> + Send,
    B: warp::Buf,
{
    let request: DiscoveryRequest = match json_body(body, &state).await {
        Ok(r) => r,
        Err(reply) => return reply,
    };
    // This endpoint serves endpoints only: an answer of ClusterLoadAssignments to a request
    // for another type (clusters, listeners) would be taken as that type's resources.
    // Envoy's REST EDS names ClusterLoadAssignment; a request naming no type (by hand, say)
    // is taken as asking for it.
    if !request.type_url.is_empty() && request.type_url != eds::CLUSTER_LOAD_ASSIGNMENT_TYPE {
        let code = "unsupported_type";
        state.metrics.bad_request(code);
        return error_reply(
            StatusCode::BAD_REQUEST,
            code,
            format!(
                "type_url {:?}: this endpoint serves {} only",
                request.type_url,
                eds::CLUSTER_LOAD_ASSIGNMENT_TYPE
            ),
        );
    }
    if let Some(detail) = &request.error_detail {
        tracing::warn!(%detail, version = %request.version_info, "Envoy rejected an EDS response");
    }
    match readiness(&state).await {
        Ok(()) => {}
        // An answer now would list only the workers heard so far (none, just after a
        // restart) and empty Envoy's clusters under live traffic; a failed update keeps the
        // endpoints Envoy has (crate::readiness, crate::pools::first_polls).
        Err(Some(waiting)) => {
            state.metrics.bad_request("starting");
            return error_reply(
                StatusCode::SERVICE_UNAVAILABLE,
                "starting",
                format!("not ready: waiting for {}", waiting.what()),
            );
        }
        Err(None) => return unavailable(&state),
    }
    let workers = match state.service.workers().await {
        Ok(w) => w,
        Err(_) => return unavailable(&state),
    };
    let views: Vec<_> = workers.into_iter().map(|w| w.view).collect();
    let (response, unusable) = eds::respond(&request, &views);
    if !unusable.is_empty() {
        tracing::warn!(?unusable, "workers left out of EDS: address is not ip:port");
    }
    warp::reply::json(&response).into_response()
}

/// `GET /metrics`.
pub async fn metrics(state: ApiState) -> Response {
    // Fold the tokenizer's cumulative cache counters into our counters.
    let stats = state.models.cache_stats();
    if let Ok(mut seen) = state.cache_stats_seen.lock() {
        state
            .metrics
            .tokenizer_cache_hits
            .inc_by(stats.hits.saturating_sub(seen.hits));
        state
            .metrics
            .tokenizer_cache_misses
            .inc_by(stats.misses.saturating_sub(seen.misses));
        *seen = stats;
    }
    state
        .metrics
        .nats_connected
        .set(i64::from(nats_state(&state) == "connected"));
    let mut text = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &state.registry) {
        return error_reply(StatusCode::INTERNAL_SERVER_ERROR, "metrics", e.to_string());
    }
    warp::reply::with_header(
        text,
        "content-type",
        "application/openmetrics-text; version=1.0.0; charset=utf-8",
    )
    .into_response()
}

/// `GET /healthz`: 200 whenever HTTP serves; NATS state is informational (routing keeps
/// working on the last known state while NATS is away).
pub async fn health(state: ApiState) -> Response {
    let nats = nats_state(&state);
    warp::reply::json(&serde_json::json!({ "status": "ok", "nats": nats })).into_response()
}

/// The NATS connection as `/healthz` names it: `connecting`, `disconnected`, `connected`, or
/// `not_answering` when the connection is up but the server echoes nothing back (stopped or
/// wedged; `switchyard_bus::echo`), which async-nats alone takes minutes to notice.
fn nats_state(state: &ApiState) -> &'static str {
    match state.nats.connection_state() {
        async_nats::connection::State::Connected if state.readiness.is_nats_silent() => {
            "not_answering"
        }
        async_nats::connection::State::Connected => "connected",
        async_nats::connection::State::Pending => "connecting",
        async_nats::connection::State::Disconnected => "disconnected",
    }
}
