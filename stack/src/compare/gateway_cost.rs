//! Measures the gateway's CPU cost per prompt token on this machine, for the cross-check's
//! virtual replays ([`switchyard_sim::replay::GatewayModel`]).
//!
//! Before a request's prompt reaches an engine on the real stack it is parsed and tokenized
//! twice: by the control plane (chat template + tokenizer, to route it) and by the worker
//! that first runs it (the agg/decode worker, or the prefill worker of a disaggregated
//! request). Both are CPU work proportional to the prompt length, and concurrent requests
//! share the machine's cores doing it. Virtual time leaves it out by default; to compare
//! like with like, the cross-check times the very same work here, on the workload's own
//! request bodies, and gives the virtual stack that cost (× the workers' time scale, since
//! every wall millisecond on the real stack is reported as `time_scale` modelled ones).
//!
//! A disaggregated request is tokenized a third time, by the decode worker after the prefill
//! leg; that one is modelled as a delay before the KV transfer. What this leaves out (so the
//! model is a lower bound of the real path): Envoy buffering the body, the filter's JSON
//! rewrites and HTTP calls, and the KV pull's round trip.

use std::path::Path;

use switchyard_protocol::route::ApiKind;
use switchyard_protocol::tokenize::ModelTokenizer;
use switchyard_sim::replay::GatewayModel;

use super::workload::PreparedWorkload;
use super::CompareError;

/// Tokenizations on the path to the first engine: the control plane's and the worker's.
pub const TOKENIZATIONS_BEFORE_ENGINE: f64 = 2.0;
/// Tokenizations between a disaggregated request's prefill leg and its KV transfer: the
/// decode worker's.
pub const TOKENIZATIONS_ON_DECODE_LEG: f64 = 1.0;
/// Requests whose bodies are timed (the first ones of the workload).
const SAMPLE_REQUESTS: usize = 8;
/// Timed passes over the sample after one warm-up pass; their mean is used.
const PASSES: usize = 2;

/// Measures wall milliseconds per prompt token of one parse + tokenization of the workload's
/// first request bodies, with the real tokenizer and no segment cache (each request's content
/// is new to the control plane and the worker).
///
/// # Errors
/// [`CompareError::Tokenizer`] if the tokenizer cannot be loaded or rejects a body.
pub fn measure_wall_ms_per_token(
    prepared: &PreparedWorkload,
    model_dir: &Path,
) -> Result<f64, CompareError> {
    let tokenizer = ModelTokenizer::from_dir_with_cache_bytes(model_dir, 0)
        .map_err(|e| CompareError::Tokenizer(format!("{}: {e}", model_dir.display())))?;
    let bodies: Vec<Vec<u8>> = prepared
        .workload
        .requests
        .iter()
        .take(SAMPLE_REQUESTS)
        .map(|r| serde_json::to_vec(&prepared.builder.body(r)).unwrap_or_default())
        .collect();
    let mut tokens = 0u64;
    let mut secs = 0.0f64;
    for pass in 0..=PASSES {
        for body in &bodies {
            let (n, s) = time_one(&tokenizer, body)?;
            if pass > 0 {
                tokens += n;
                secs += s;
            }
        }
    }
    if tokens == 0 {
        return Ok(0.0);
    }
    Ok(secs * 1e3 / tokens as f64)
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

/// The virtual stack's gateway model for workers running `time_scale` times faster than the
/// modelled hardware, from a measured `wall_ms_per_token`, on `cpus` cores.
pub fn gateway_model(wall_ms_per_token: f64, time_scale: f64, cpus: u32) -> GatewayModel {
    GatewayModel {
        ms_per_prompt_token: (wall_ms_per_token * TOKENIZATIONS_BEFORE_ENGINE * time_scale)
            .max(0.0),
        cpus: cpus.max(1),
        decode_leg_ms_per_prompt_token: (wall_ms_per_token
            * TOKENIZATIONS_ON_DECODE_LEG
            * time_scale)
            .max(0.0),
    }
}

/// Cores this process may use (the stack's processes share the same ones).
pub fn machine_cpus() -> u32 {
    std::thread::available_parallelism()
        .map(|n| u32::try_from(n.get()).unwrap_or(u32::MAX))
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_scales_wall_cost_to_modelled_time() {
        let m = gateway_model(0.003, 4.0, 2);
        assert!((m.ms_per_prompt_token - 0.024).abs() < 1e-12);
        assert!((m.decode_leg_ms_per_prompt_token - 0.012).abs() < 1e-12);
        assert_eq!(m.cpus, 2);
        assert_eq!(gateway_model(-1.0, 1.0, 0).cpus, 1);
        assert!(gateway_model(-1.0, 1.0, 0).is_free());
    }
}
