//! SGLang's load, from its Prometheus `/metrics` text (the server started with
//! `--enable-metrics`). The gauges used:
//! - `sglang:num_running_reqs`, `sglang:num_queue_reqs`: requests running / queued;
//! - `sglang:token_usage`: fraction (0..1) of the KV pool's tokens in use;
//! - `sglang:max_total_num_tokens`, when the engine exports it (newer SGLang): the KV pool's
//!   size in tokens, so the capacity in blocks (pages) when the pool file does not declare
//!   it;
//! - `sglang:page_size`, when exported: the block size, checked against the pool file's.
//!
//! SGLang exports one series per data-parallel rank where it runs several: counts and
//! capacities are summed, the usage fraction averaged.

use super::exposition::{capacity_blocks, count, Sample, Sum};
use super::{EngineLoad, ScrapeError};

/// Requests running.
pub const RUNNING: &str = "sglang:num_running_reqs";
/// Requests queued.
pub const WAITING: &str = "sglang:num_queue_reqs";
/// Fraction of KV tokens in use.
pub const TOKEN_USAGE: &str = "sglang:token_usage";
/// KV pool size in tokens (not in every SGLang).
pub const MAX_TOTAL_TOKENS: &str = "sglang:max_total_num_tokens";
/// Tokens per page (not in every SGLang).
pub const PAGE_SIZE: &str = "sglang:page_size";

/// Reads the load from exposition-format `text`; `block_size` (tokens per page) turns the
/// token capacity into blocks.
///
/// # Errors
/// [`ScrapeError::Missing`] when a needed gauge is absent.
pub fn parse(text: &str, block_size: u32) -> Result<EngineLoad, ScrapeError> {
    let mut running = Sum::default();
    let mut waiting = Sum::default();
    let mut usage = Sum::default();
    let mut tokens = Sum::default();
    let mut page_size = None;
    let mut served_model = None;
    for sample in text.lines().filter_map(Sample::parse) {
        if served_model.is_none() && sample.name == RUNNING {
            served_model = sample.label("model_name").map(str::to_owned);
        }
        match sample.name {
            RUNNING => running.add(sample.value),
            WAITING => waiting.add(sample.value),
            TOKEN_USAGE => usage.add(sample.value),
            MAX_TOTAL_TOKENS => tokens.add(sample.value),
            PAGE_SIZE => page_size = page_size.or(Some(sample.value)),
            _ => {}
        }
    }
    let per_block = f64::from(block_size.max(1));
    Ok(EngineLoad {
        running: count(running.total().ok_or(ScrapeError::Missing(RUNNING))?),
        waiting: count(waiting.total().ok_or(ScrapeError::Missing(WAITING))?),
        kv_usage: usage
            .mean()
            .ok_or(ScrapeError::Missing(TOKEN_USAGE))?
            .clamp(0.0, 1.0),
        capacity_blocks: tokens.total().and_then(|t| capacity_blocks(t / per_block)),
        block_size: page_size.map(count).filter(|s| *s > 0),
        served_model,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_protocol::worker::WorkerId;

    /// Written after SGLang's metric names (no SGLang was run for it).
    const SGLANG: &str = r#"
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="qwen",tp_rank="0"} 3.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="qwen",tp_rank="0"} 7.0
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type="unified",model_name="qwen",tp_rank="0"} 0.5
sglang:num_used_tokens{model_name="qwen"} 2048.0
sglang:max_total_num_tokens{model_name="qwen"} 4096.0
sglang:page_size{model_name="qwen"} 64.0
sglang:cache_hit_rate{model_name="qwen"} 0.25
"#;

    #[test]
    fn the_load_and_capacity_come_from_sglangs_gauges() {
        let load = parse(SGLANG, 64).unwrap();
        assert_eq!((load.running, load.waiting), (3, 7));
        assert!((load.kv_usage - 0.5).abs() < 1e-9);
        assert_eq!(load.capacity_blocks, Some(64), "4096 tokens in pages of 64");
        assert_eq!(load.block_size, Some(64));
        let report = load.report(&WorkerId("s".into()), 64);
        assert_eq!((report.kv_used_blocks, report.kv_total_blocks), (32, 64));
    }

    #[test]
    fn without_the_capacity_gauges_the_load_still_reads() {
        let text = "sglang:num_running_reqs 1\nsglang:num_queue_reqs 0\nsglang:token_usage 1.5\n";
        let load = parse(text, 16).unwrap();
        assert_eq!(load.capacity_blocks, None);
        assert_eq!(load.block_size, None);
        assert_eq!(load.kv_usage, 1.0, "clamped");
    }

    #[test]
    fn a_capacity_no_engine_has_is_not_taken() {
        for tokens in ["1e30", "1e12", "NaN", "0.5"] {
            let text = format!(
                "sglang:num_running_reqs 1\nsglang:num_queue_reqs 0\nsglang:token_usage 0.5\nsglang:max_total_num_tokens {tokens}\n"
            );
            let load = parse(&text, 16).unwrap();
            let expected = (tokens == "1e12").then_some(62_500_000_000);
            assert_eq!(load.capacity_blocks, expected, "{tokens}");
        }
    }

    #[test]
    fn ranks_are_summed_and_usage_averaged() {
        let text = r#"
sglang:num_running_reqs{dp_rank="0"} 1
sglang:num_running_reqs{dp_rank="1"} 2
sglang:num_queue_reqs{dp_rank="0"} 4
sglang:token_usage{dp_rank="0"} 0.2
sglang:token_usage{dp_rank="1"} 0.6
sglang:max_total_num_tokens{dp_rank="0"} 160
sglang:max_total_num_tokens{dp_rank="1"} 160
"#;
        let load = parse(text, 16).unwrap();
        assert_eq!((load.running, load.waiting), (3, 4));
        assert!((load.kv_usage - 0.4).abs() < 1e-9);
        assert_eq!(load.capacity_blocks, Some(20));
    }

    #[test]
    fn vllms_metrics_are_not_sglangs() {
        let text = "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n";
        assert_eq!(parse(text, 16), Err(ScrapeError::Missing(RUNNING)));
        let text = "sglang:num_running_reqs 1\nsglang:num_queue_reqs 0\n";
        assert_eq!(parse(text, 16), Err(ScrapeError::Missing(TOKEN_USAGE)));
    }
}
