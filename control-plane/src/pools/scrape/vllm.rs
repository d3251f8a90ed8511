//! vLLM's load, from its Prometheus `/metrics` text. The gauges used:
//! - `vllm:num_requests_running`, `vllm:num_requests_waiting`: requests scheduled / queued;
//! - `vllm:kv_cache_usage_perc`: fraction (0..1) of KV blocks in use;
//! - `vllm:cache_config_info`: an info gauge whose labels carry `num_gpu_blocks` and
//!   `block_size` (the KV capacity, when the pool file does not declare it).
//!
//! A data-parallel engine exports one series per rank (label `engine`): counts are summed,
//! the usage fraction averaged.

use super::exposition::{capacity_blocks, count, Sample, Sum};
use super::{EngineLoad, ScrapeError};

/// Requests being computed.
pub const RUNNING: &str = "vllm:num_requests_running";
/// Requests queued.
pub const WAITING: &str = "vllm:num_requests_waiting";
/// Fraction of KV blocks in use.
pub const KV_USAGE: &str = "vllm:kv_cache_usage_perc";
/// Info gauge with the cache configuration in its labels.
pub const CACHE_CONFIG: &str = "vllm:cache_config_info";

/// Reads the load from exposition-format `text`.
///
/// # Errors
/// [`ScrapeError::Missing`] when a needed gauge is absent.
pub fn parse(text: &str) -> Result<EngineLoad, ScrapeError> {
    let mut running = Sum::default();
    let mut waiting = Sum::default();
    let mut usage = Sum::default();
    let mut blocks = Sum::default();
    let mut block_size = None;
    let mut served_model = None;
    for sample in text.lines().filter_map(Sample::parse) {
        if served_model.is_none() && sample.name == RUNNING {
            served_model = sample.label("model_name").map(str::to_owned);
        }
        match sample.name {
            RUNNING => running.add(sample.value),
            WAITING => waiting.add(sample.value),
            KV_USAGE => usage.add(sample.value),
            CACHE_CONFIG => {
                if let Some(n) = sample.label("num_gpu_blocks").and_then(|v| v.parse().ok()) {
                    blocks.add(n);
                }
                block_size = block_size.or(sample
                    .label("block_size")
                    .and_then(|v| v.parse::<u32>().ok()));
            }
            _ => {}
        }
    }
    Ok(EngineLoad {
        running: count(running.total().ok_or(ScrapeError::Missing(RUNNING))?),
        waiting: count(waiting.total().ok_or(ScrapeError::Missing(WAITING))?),
        kv_usage: usage
            .mean()
            .ok_or(ScrapeError::Missing(KV_USAGE))?
            .clamp(0.0, 1.0),
        capacity_blocks: blocks.total().and_then(capacity_blocks),
        block_size,
        served_model,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_protocol::worker::WorkerId;

    /// Trimmed from a real vLLM 0.32 `/metrics` (CPU build, tiny model).
    const VLLM: &str = r#"
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 5.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="1000",prefix_caching_hash_algo="sha256"} 1.0
vllm:prompt_tokens_total{engine="0",model_name="tiny"} 1234.0
"#;

    #[test]
    fn the_served_model_name_comes_from_the_labels() {
        assert_eq!(parse(VLLM).unwrap().served_model.as_deref(), Some("tiny"));
        let unlabelled = "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.5\n";
        assert_eq!(parse(unlabelled).unwrap().served_model, None);
    }

    #[test]
    fn the_load_and_capacity_come_from_vllms_gauges() {
        let load = parse(VLLM).unwrap();
        assert_eq!((load.running, load.waiting), (2, 5));
        assert!((load.kv_usage - 0.25).abs() < 1e-9);
        assert_eq!(load.capacity_blocks, Some(1000));
        assert_eq!(load.block_size, Some(16));
        let report = load.report(&WorkerId("w".into()), 1000);
        assert_eq!(report.kv_used_blocks, 250);
        assert_eq!(report.kv_total_blocks, 1000);
        assert_eq!((report.running, report.waiting), (2, 5));
    }

    #[test]
    fn ranks_are_summed_and_usage_averaged() {
        let text = r#"
vllm:num_requests_running{engine="0"} 1
vllm:num_requests_running{engine="1"} 3
vllm:num_requests_waiting{engine="0"} 0
vllm:kv_cache_usage_perc{engine="0"} 0.2
vllm:kv_cache_usage_perc{engine="1"} 0.4
vllm:cache_config_info{engine="0",num_gpu_blocks="10"} 1
vllm:cache_config_info{engine="1",num_gpu_blocks="30"} 1
"#;
        let load = parse(text).unwrap();
        assert_eq!(load.running, 4);
        assert!((load.kv_usage - 0.3).abs() < 1e-9);
        assert_eq!(load.capacity_blocks, Some(40));
    }

    #[test]
    fn missing_gauges_are_named_and_garbage_is_skipped() {
        assert_eq!(
            parse("garbage\n{{{ 1\nvllm:num_requests_running"),
            Err(ScrapeError::Missing(RUNNING))
        );
        let text = "vllm:num_requests_running 1\nvllm:num_requests_waiting NaN\n";
        assert_eq!(parse(text), Err(ScrapeError::Missing(WAITING)));
        let text = "vllm:num_requests_running -3\nvllm:num_requests_waiting 1e30\nvllm:kv_cache_usage_perc 7\n";
        let load = parse(text).unwrap();
        assert_eq!((load.running, load.waiting), (0, u32::MAX), "clamped");
        assert_eq!(load.kv_usage, 1.0);
        assert_eq!(load.capacity_blocks, None);
    }
}
