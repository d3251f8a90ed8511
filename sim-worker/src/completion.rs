//! One OpenAI completion request, end to end: parse, tokenize, decide how its KV is obtained
//! (local prefill, prefill leg for a remote decode, or a pull from a prefill worker), submit
//! to the engine, and answer as JSON or SSE.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;
use switchyard_protocol::openai::{check_prompt_length, clamp_max_tokens};
use switchyard_protocol::route::ApiKind;
use switchyard_protocol::tokenize::TokenizeError;
use switchyard_protocol::worker::{Engine, WorkerRole};
use tokio::sync::mpsc;

use switchyard_engine::{EngineError, EngineRequest, HeldKv, Prompt};

use super::context::WorkerContext;
use super::error::ApiError;
use super::handoff::{self, hold_id, prefill_response_params};
use super::legs::{self, KvSource, LegRequest, PrefillAnswer};
use super::metrics::PullFailure;
use super::openai::{filler_text, parse_request, ParsedRequest, ResponseMeta, Usage};
use super::runtime::RequestEvent;
use super::stream::{AbortGuard, SseStream};

/// What the handler answers.
#[derive(Debug)]
pub enum Answer {
    /// One JSON body, status 200.
    Json(Value),
    /// An SSE stream.
    Stream(SseStream),
}

/// The token id a simulated context server reports as its first generated token: no model
/// runs, so any id of the vocabulary will do.
const SIMULATED_FIRST_TOKEN: u32 = 0;

/// How the request's prompt KV is obtained.
enum Plan {
    /// Prefill here (prefix-cache hits count).
    Local,
    /// Prefill leg: one token, KV held for a decode worker (under SGLang's room, if any).
    PrefillForRemote { room: Option<u64> },
    /// KV fetched from a prefill worker.
    Remote(KvSource),
}

impl Plan {
    /// What the request's handoff fields ask of a worker of `role`: a prefill leg only on a
    /// prefill worker, a decode leg only on a worker that decodes; anything else is served
    /// whole (as vLLM serves a prefill leg sent to a decode worker).
    fn new(role: WorkerRole, leg: Option<LegRequest>) -> Plan {
        match (role, leg) {
            (WorkerRole::Prefill, Some(LegRequest::Prefill { room })) => {
                Plan::PrefillForRemote { room }
            }
            (WorkerRole::Decode | WorkerRole::Agg, Some(LegRequest::Decode(source))) => {
                Plan::Remote(source)
            }
            _ => Plan::Local,
        }
    }

    fn as_str(&self) -> &'static str {
        match self {
            Plan::Local => "local",
            Plan::PrefillForRemote { .. } => "prefill_for_remote_decode",
            Plan::Remote(_) => "remote_prefill",
        }
    }
}

/// Serves one completion request.
///
/// # Errors
/// An [`ApiError`] to answer (4xx for the client's mistakes, 5xx for ours).
/// `request_id` is the client's `x-request-id`; it names the response (`chatcmpl-<id>`) as in
/// vLLM, else the worker makes one up.
pub async fn serve(
    ctx: Arc<WorkerContext>,
    api: ApiKind,
    request_id: Option<String>,
    body: Bytes,
) -> Result<Answer, ApiError> {
    if ctx.faults.refuse_next() {
        return Err(ApiError::unavailable(
            "simulated fault: this worker refuses every --unavailable-every'th request",
        ));
    }
    let body: Value = serde_json::from_slice(switchyard_protocol::without_bom(&body))
        .map_err(|e| ApiError::bad_request(format!("request body is not valid JSON: {e}"), None))?;
    let leg = match &body {
        Value::Object(fields) => {
            legs::check_disagg_request_id(ctx.engine_kind, ctx.disagg_request_id, fields)?;
            legs::read(ctx.engine_kind, ctx.role, fields)?
        }
        _ => None,
    };
    let mut req = parse_request(api, body, ctx.max_model_len)?;
    let mut tokens = tokenize(&ctx, api, &req.body).await?;
    if let Some(truncation) = req.truncation {
        truncation.apply(&mut tokens);
    }
    check_prompt_length(tokens.len(), ctx.max_model_len).map_err(ApiError::from)?;
    req.max_tokens = clamp_max_tokens(req.max_tokens, tokens.len(), ctx.max_model_len);
    match api {
        ApiKind::Chat => ctx.metrics.requests_chat.fetch_add(1, Ordering::Relaxed),
        ApiKind::Completions => ctx
            .metrics
            .requests_completions
            .fetch_add(1, Ordering::Relaxed),
    };
    let plan = Plan::new(ctx.role, leg);
    let id = ctx.next_request_id();
    tracing::debug!(
        worker = %ctx.id,
        request = id,
        request_id = request_id.as_deref().unwrap_or("-"),
        api = api.as_str(),
        prompt_tokens = tokens.len(),
        max_tokens = req.max_tokens,
        plan = plan.as_str(),
        "request accepted"
    );
    let prompt = ctx.engine_prompt(tokens, req.cache_salt.as_deref());
    let prefix_hash = match plan {
        Plan::PrefillForRemote { .. } => ctx.prefix_hash(&prompt),
        _ => None,
    };
    let engine_req = match &plan {
        Plan::Local => EngineRequest::local(id, prompt, req.max_tokens),
        Plan::PrefillForRemote { .. } => EngineRequest::prefill_for_remote_decode(id, prompt),
        Plan::Remote(source) => remote_decode_request(&ctx, &req, source, id, prompt).await?,
    };
    let engine_req = if req.prompt_logprobs {
        engine_req.recomputing()
    } else {
        engine_req
    };
    let events = submit(&ctx, engine_req).await?;
    let guard = AbortGuard::new(ctx.engine.clone(), id);
    let meta = ResponseMeta {
        id: format!(
            "{}{}",
            ResponseMeta::id_prefix(api),
            request_id.unwrap_or_else(|| hold_id(&ctx.id.0, ctx.instance_id, id))
        ),
        created: unix_seconds(),
        model: req.model.clone().unwrap_or_else(|| ctx.model_name.clone()),
        endpoint: api,
    };
    if req.stream && !matches!(plan, Plan::PrefillForRemote { .. }) {
        return Ok(Answer::Stream(SseStream::new(
            events,
            meta,
            req.include_usage,
            guard,
        )));
    }
    let (usage, held) = collect(events, guard).await?;
    let answer = match (plan, held) {
        (Plan::PrefillForRemote { room }, Some(held)) => {
            ctx.metrics.kv_holds.fetch_add(1, Ordering::Relaxed);
            let now = ctx.clock.now_ms();
            ctx.holds
                .insert(id, room, prefix_hash, held.expires_at_ms, now);
            let hold = hold_id(&ctx.id.0, ctx.instance_id, id);
            let (host, port) = (&ctx.advertised_host, ctx.port);
            match ctx.engine_kind {
                Engine::Vllm => Some(PrefillAnswer::Vllm(prefill_response_params(
                    &ctx.id.0,
                    hold,
                    &held.block_ids,
                    host,
                    port,
                ))),
                Engine::Trtllm => Some(PrefillAnswer::Trtllm(legs::trtllm_context_params(
                    id,
                    SIMULATED_FIRST_TOKEN,
                    host,
                    port,
                    hold,
                ))),
                Engine::Sglang => None,
            }
        }
        _ => None,
    };
    let text = filler_text(usage.completion_tokens);
    Ok(Answer::Json(meta.full_response(
        &text,
        usage,
        answer.as_ref(),
    )))
}

/// Tokenizes on the blocking pool (a long prompt takes milliseconds of CPU).
async fn tokenize(ctx: &WorkerContext, api: ApiKind, body: &Value) -> Result<Vec<u32>, ApiError> {
    let tokenizer = ctx.tokenizer.clone();
    let body = body.clone();
    let result = tokio::task::spawn_blocking(move || tokenizer.tokenize_request(api, &body))
        .await
        .map_err(|e| ApiError::internal(format!("tokenizer task failed: {e}")))?;
    match result {
        Ok(tokens) => Ok(tokens),
        Err(TokenizeError::InvalidRequest { field, message }) => Err(ApiError::bad_request(
            format!("`{field}`: {message}"),
            Some(&field),
        )),
        Err(other) => Err(ApiError::internal(format!(
            "cannot tokenize the prompt: {other}"
        ))),
    }
}

/// The decode leg: fetch the KV, wait the modelled transfer, and submit it as remote KV.
/// Where the KV cannot be had: vLLM and TensorRT-LLM workers prefill locally (counted), as
/// vLLM recomputes KV it failed to load; an SGLang worker fails the request (500), since
/// SGLang's decode side has no local prefill to fall back on.
async fn remote_decode_request(
    ctx: &WorkerContext,
    req: &ParsedRequest,
    source: &KvSource,
    id: u64,
    prompt: Prompt,
) -> Result<EngineRequest, ApiError> {
    let prompt_tokens = u64::from(prompt.len());
    let pulled = match source {
        KvSource::Hold(Ok(target)) => handoff::pull(&ctx.http, target, &ctx.id.0).await,
        KvSource::Hold(Err(failure)) => Err(*failure),
        KvSource::Room(target) => handoff::pull_room(&ctx.http, target, &ctx.id.0).await,
    };
    let pulled = pulled.and_then(|held| {
        let same_prefix = held.prefix_hash == ctx.prefix_hash(&prompt);
        if u64::from(held.prompt_tokens) == prompt_tokens && same_prefix {
            Ok(held)
        } else {
            Err(PullFailure::Mismatch)
        }
    });
    if let Err(failure) = pulled {
        ctx.metrics.pull_failed(failure);
        if let KvSource::Room(_) = source {
            tracing::warn!(worker = %ctx.id, reason = failure.as_str(), "KV transfer from the bootstrap room failed; the request fails");
            return Err(ApiError::internal(format!(
                "KV transfer from the prefill worker failed ({}); this decode worker cannot prefill locally",
                failure.as_str()
            )));
        }
        tracing::warn!(worker = %ctx.id, reason = failure.as_str(), "KV pull failed; prefilling locally");
        return Ok(EngineRequest::local(id, prompt, req.max_tokens));
    }
    let transfer = ctx.engine_config.transfer;
    let cached = match transfer.mode {
        switchyard_engine::TransferMode::WholePrompt => 0,
        switchyard_engine::TransferMode::MissingSuffix => ctx
            .engine
            .readable_prefix_tokens(prompt.clone())
            .await
            .unwrap_or(0),
    };
    let moved = transfer.tokens_to_move(prompt_tokens, u64::from(cached));
    let ms = transfer.time_ms(moved);
    tokio::time::sleep(ctx.clock.real_duration(ms)).await;
    let m = &ctx.metrics;
    m.kv_pulls.fetch_add(1, Ordering::Relaxed);
    m.kv_transfer_tokens.fetch_add(moved, Ordering::Relaxed);
    m.kv_transfer_us
        .fetch_add((ms * 1e3) as u64, Ordering::Relaxed);
    Ok(EngineRequest::decode_with_remote_kv(
        id,
        prompt,
        req.max_tokens,
    ))
}

async fn submit(
    ctx: &WorkerContext,
    req: EngineRequest,
) -> Result<mpsc::UnboundedReceiver<RequestEvent>, ApiError> {
    match ctx.engine.submit(req).await {
        Err(_) => Err(ApiError::unavailable("the worker is shutting down")),
        Ok(Ok(events)) => Ok(events),
        Ok(Err(e @ (EngineError::ExceedsKvCapacity { .. } | EngineError::EmptyPrompt { .. }))) => {
            Err(ApiError::bad_request(e.to_string(), None))
        }
        Ok(Err(e)) => Err(ApiError::internal(e.to_string())),
    }
}

/// Waits for a non-streamed request to finish.
async fn collect(
    mut events: mpsc::UnboundedReceiver<RequestEvent>,
    mut guard: AbortGuard,
) -> Result<(Usage, Option<HeldKv>), ApiError> {
    while let Some(event) = events.recv().await {
        if let RequestEvent::Finished {
            prompt_tokens,
            completion_tokens,
            cached_tokens,
            remote_tokens,
            held,
        } = event
        {
            guard.disarm();
            let usage = Usage {
                prompt_tokens,
                completion_tokens,
                cached_tokens: (cached_tokens + remote_tokens).min(prompt_tokens),
            };
            return Ok((usage, held));
        }
    }
    Err(ApiError::unavailable(
        "the worker stopped before the request finished",
    ))
}

/// Unix time in seconds for the responses' `created` field.
#[allow(clippy::disallowed_methods)] // OpenAI's `created` is wall-clock time by definition.
fn unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
