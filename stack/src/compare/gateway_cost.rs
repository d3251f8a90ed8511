//! Measures the gateway's CPU cost per prompt token on this machine, for the cross-check's
//! virtual replays ([`switchyard_replay::GatewayModel`]).
//!
//! Before a request's prompt reaches an engine on the real stack it is parsed and tokenized
//! twice: by the control plane (chat template + tokenizer, to route it; at most
//! `--route-tokenize-threads` at once, FIFO beyond) and by the worker that first runs it (the
//! agg/decode worker, or the prefill worker of a disaggregated request; unbounded). Both are
//! CPU work proportional to the prompt length, and concurrent requests share the machine's
//! cores doing it. A route call that has not answered within the filter's route timeout fails
//! open. Virtual time leaves all of this out by default; to compare like with like, the
//! cross-check times the very same work here, on the workload's own request bodies, and gives
//! the virtual stack that cost (× the workers' speed-up, since every wall millisecond on the
//! real stack is reported as `speed_up` modelled ones), the control plane's thread bound,
//! and the filter's timeout.
//!
//! A disaggregated request is tokenized a third time, by the decode worker after the prefill
//! leg; that one is modelled as a delay before the KV transfer. What this leaves out (so the
//! model is a lower bound of the real path): Envoy buffering the body, the filter's JSON
//! rewrites and HTTP calls, and the KV pull's round trip.

use std::path::Path;

use switchyard_control_plane::api::tokenize_lanes::LONG_BODY_BYTES;
use switchyard_engine::SpeedUp;
use switchyard_filter::config::{DEFAULT_ROUTE_TIMEOUT_MS_PER_MIB, MAX_ROUTE_TIMEOUT_MS};
use switchyard_protocol::route::ApiKind;
use switchyard_protocol::tokenize::ModelTokenizer;
use switchyard_replay::GatewayModel;

use super::workload::PreparedWorkload;
use super::CompareError;

/// Tokenizations between a disaggregated request's prefill leg and its KV transfer: the
/// decode worker's.
pub const TOKENIZATIONS_ON_DECODE_LEG: f64 = 1.0;
/// Requests whose bodies are timed: the first ones of the workload, plus its longest ones
/// (they carry most of a burst's tokens; per token they cost as much or less: 2.9–4.0 µs
/// against 4.1–4.6 µs for 7k-token prompts, measured 2026-11-30 under load).
const SAMPLE_REQUESTS: usize = 8;
/// The longest requests added to the sample.
const SAMPLE_LONGEST: usize = 4;
/// Timed passes over the sample after one warm-up pass; their mean is used.
const PASSES: usize = 2;
/// Segment cache of the tokenizer timed warm: room for the whole sample.
const CACHE_BYTES: usize = 256 << 20;

/// Wall ms per prompt token of the gateway's CPU work, measured on this machine.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct MeasuredCost {
    /// Rendering and serializing a request body (the client's work before the body reaches
    /// Envoy; Envoy's own buffering is about 100× cheaper per byte, docs/filter-overhead.md).
    pub body_ms_per_token: f64,
    /// One parse + chat template + tokenization of a body (the control plane's, a worker's).
    pub tokenize_ms_per_token: f64,
    /// The control plane's route tokenization of a body whose text its segment cache holds
    /// (parse, chat template, cache lookups).
    pub tokenize_cached_ms_per_token: f64,
    /// Body bytes per prompt token (for the control plane's lanes and the filter's per-MiB
    /// route budget, which go by bytes).
    pub body_bytes_per_token: f64,
}

/// Measures wall milliseconds per prompt token of rendering a body and of one parse +
/// tokenization of it, on the workload's first and longest requests, with the real tokenizer
/// and no segment cache (each request's content is new to the control plane and the worker).
///
/// # Errors
/// [`CompareError::Tokenizer`] if the tokenizer cannot be loaded or rejects a body.
pub fn measure(
    prepared: &PreparedWorkload,
    model_dir: &Path,
) -> Result<MeasuredCost, CompareError> {
    let load = |cache_bytes| {
        ModelTokenizer::from_dir_with_cache_bytes(model_dir, cache_bytes)
            .map_err(|e| CompareError::Tokenizer(format!("{}: {e}", model_dir.display())))
    };
    let tokenizer = load(0)?;
    let cached = load(CACHE_BYTES)?;
    let mut by_length: Vec<_> = prepared.workload.requests.iter().collect();
    by_length.sort_by_key(|r| std::cmp::Reverse(r.isl()));
    let sample: Vec<_> = prepared
        .workload
        .requests
        .iter()
        .take(SAMPLE_REQUESTS)
        .chain(by_length.into_iter().take(SAMPLE_LONGEST))
        .collect();
    let (mut tokens, mut bytes) = (0u64, 0usize);
    let (mut body_s, mut tokenize_s, mut cached_s) = (0.0f64, 0.0f64, 0.0f64);
    for pass in 0..=PASSES {
        for request in &sample {
            let (body, render) = render_one(prepared, request);
            let (n, s) = time_one(&tokenizer, &body)?;
            // The first pass fills the segment cache; later ones find every chunk in it.
            let (_, warm) = time_one(&cached, &body)?;
            if pass > 0 {
                tokens += n;
                bytes += body.len();
                body_s += render;
                tokenize_s += s;
                cached_s += warm;
            }
        }
    }
    if tokens == 0 {
        return Ok(MeasuredCost::default());
    }
    let per_token = |seconds: f64| seconds * 1e3 / tokens as f64;
    Ok(MeasuredCost {
        body_ms_per_token: per_token(body_s),
        tokenize_ms_per_token: per_token(tokenize_s),
        tokenize_cached_ms_per_token: per_token(cached_s),
        body_bytes_per_token: bytes as f64 / tokens as f64,
    })
}

/// Renders and serializes one body as the client does; returns it and the wall seconds.
#[allow(clippy::disallowed_methods)] // Measures real CPU time on this machine by definition.
fn render_one(
    prepared: &PreparedWorkload,
    request: &switchyard_loadgen::PlannedRequest,
) -> (Vec<u8>, f64) {
    let start = std::time::Instant::now();
    let body = serde_json::to_vec(&prepared.builder.body(request)).unwrap_or_default();
    (body, start.elapsed().as_secs_f64())
}

/// Parses and tokenizes one body as the control plane does; returns (tokens, wall seconds).
#[allow(clippy::disallowed_methods)] // Measures real CPU time on this machine by definition.
fn time_one(tokenizer: &ModelTokenizer, body: &[u8]) -> Result<(u64, f64), CompareError> {
    let start = std::time::Instant::now();
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| CompareError::Tokenizer(format!("request body: {e}")))?;
    let ids = tokenizer
        .tokenize_request(ApiKind::Chat, &value)
        .map_err(|e| CompareError::Tokenizer(e.to_string()))?;
    Ok((ids.len() as u64, start.elapsed().as_secs_f64()))
}

/// The virtual stack's gateway model for workers running `speed_up` times faster than the
/// modelled hardware, from `measured` wall costs, on `cpus` cores, with the control plane's
/// `route_threads` and the filter's `route_timeout_wall_ms`.
pub fn gateway_model(
    measured: MeasuredCost,
    speed_up: SpeedUp,
    cpus: f64,
    route_threads: u32,
    route_timeout_wall_ms: u64,
) -> GatewayModel {
    let per_token = speed_up.model_ms(measured.tokenize_ms_per_token).max(0.0);
    let cached_per_token = speed_up
        .model_ms(measured.tokenize_cached_ms_per_token)
        .max(0.0);
    let bytes_per_token = measured.body_bytes_per_token;
    let known_bytes = bytes_per_token.is_finite() && bytes_per_token > 0.0;
    // The control plane's lanes and the filter's route budget go by body bytes.
    let long_lane_min_tokens = if known_bytes {
        (LONG_BODY_BYTES as f64 / bytes_per_token).ceil() as u64
    } else {
        0
    };
    let timeout_wall_ms_per_token = if known_bytes {
        DEFAULT_ROUTE_TIMEOUT_MS_PER_MIB as f64 * bytes_per_token / f64::from(1u32 << 20)
    } else {
        0.0
    };
    GatewayModel {
        body_ms_per_prompt_token: speed_up.model_ms(measured.body_ms_per_token).max(0.0),
        route_ms_per_prompt_token: per_token,
        route_ms_per_cached_token: cached_per_token,
        route_threads,
        long_lane_min_tokens,
        worker_ms_per_prompt_token: per_token,
        // The workers' tokenizer keeps the same segment cache as the control plane's.
        worker_ms_per_cached_token: cached_per_token,
        cpus: if cpus.is_finite() && cpus > 0.0 {
            cpus
        } else {
            1.0
        },
        decode_leg_ms_per_prompt_token: per_token * TOKENIZATIONS_ON_DECODE_LEG,
        decode_leg_ms_per_cached_token: cached_per_token * TOKENIZATIONS_ON_DECODE_LEG,
        route_timeout_ms: Some(speed_up.model_ms(route_timeout_wall_ms.max(1) as f64))
            .filter(|t| *t > 0.0),
        route_timeout_ms_per_token: speed_up.model_ms(timeout_wall_ms_per_token).max(0.0),
        route_timeout_cap_ms: Some(speed_up.model_ms(MAX_ROUTE_TIMEOUT_MS as f64))
            .filter(|t| *t > 0.0),
    }
}

/// Route calls the stack's control plane tokenizes at once: its `--route-tokenize-threads`
/// as it will parse it (the default, or `SWITCHYARD_ROUTE_TOKENIZE_THREADS` inherited from
/// this process's environment; the stack passes no flag).
pub fn control_plane_route_threads() -> u32 {
    use clap::Parser as _;
    switchyard_control_plane::settings::Settings::try_parse_from(["switchyard-control-plane"])
        .map_or(2, |s| s.route_tokenize_threads)
}

/// Cores this process may use (the stack's processes share the same ones).
pub fn machine_cpus() -> f64 {
    std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64)
}

/// The gateway model in one line, for the log and `comparison.md`.
pub fn gateway_summary(g: &GatewayModel) -> String {
    let threads = match g.route_threads {
        0 => "unbounded".to_string(),
        n => n.to_string(),
    };
    let timeout = g
        .route_timeout_ms
        .map_or_else(|| "none".to_string(), |t| format!("{t:.0} ms"));
    format!(
        "body rendering {:.5} modelled ms per prompt token, route tokenization {:.4} ms per \
         new token and {:.5} per token its segment cache holds, on {threads} control-plane \
         threads per lane (FIFO; prompts of {} tokens or more in the long lane), route timeout \
         {timeout} + {:.4} ms per token (fail-open), worker tokenization {:.4} ms per \
         new token and {:.5} per cached token, decode-leg tokenization {:.4} ms per new token and \
         {:.5} per cached token, all processor-shared over {:.0} cores",
        g.body_ms_per_prompt_token,
        g.route_ms_per_prompt_token,
        g.route_ms_per_cached_token,
        g.long_lane_min_tokens,
        g.route_timeout_ms_per_token,
        g.worker_ms_per_prompt_token,
        g.worker_ms_per_cached_token,
        g.decode_leg_ms_per_prompt_token,
        g.decode_leg_ms_per_cached_token,
        g.cpus
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_scales_wall_cost_to_modelled_time() {
        let cost = |body, tokenize| MeasuredCost {
            body_ms_per_token: body,
            tokenize_ms_per_token: tokenize,
            tokenize_cached_ms_per_token: tokenize / 10.0,
            body_bytes_per_token: 4.0,
        };
        let m = gateway_model(
            cost(0.0005, 0.003),
            SpeedUp::new(4.0).unwrap(),
            2.0,
            2,
            1000,
        );
        assert!((m.body_ms_per_prompt_token - 0.002).abs() < 1e-12);
        assert!((m.route_ms_per_prompt_token - 0.012).abs() < 1e-12);
        assert!((m.worker_ms_per_prompt_token - 0.012).abs() < 1e-12);
        assert!((m.decode_leg_ms_per_prompt_token - 0.012).abs() < 1e-12);
        assert!((m.route_ms_per_cached_token - 0.0012).abs() < 1e-12);
        assert_eq!(m.route_timeout_ms, Some(4000.0));
        // 64 KiB bodies at 4 bytes per token; 1000 ms per MiB, × 4 modelled.
        assert_eq!(m.long_lane_min_tokens, 16_384);
        assert!((m.route_timeout_ms_per_token - 4.0 * 1000.0 * 4.0 / 1_048_576.0).abs() < 1e-12);
        assert_eq!(m.route_timeout_cap_ms, Some(240_000.0));
        assert_eq!((m.cpus, m.route_threads), (2.0, 2));
        let free = gateway_model(cost(-1.0, -1.0), SpeedUp::REAL, 0.0, 2, 1000);
        assert_eq!(free.cpus, 1.0);
        assert!(free.is_free());
        assert!(control_plane_route_threads() >= 1);
    }
}
