//! A vLLM worker's load, read from its Prometheus `/metrics` text.
//!
//! vLLM reports no load to anyone; its metrics are the only view. The gauges used:
//! - `vllm:num_requests_running`, `vllm:num_requests_waiting`: requests scheduled / queued;
//! - `vllm:kv_cache_usage_perc`: fraction (0..1) of KV blocks in use;
//! - `vllm:cache_config_info`: an info gauge whose labels carry `num_gpu_blocks` and
//!   `block_size` (the KV capacity, when the pool file does not declare it).
//!
//! A data-parallel engine exports one series per rank (label `engine`): counts are summed,
//! the usage fraction averaged. vLLM does not export the prompt tokens it still has to
//! prefill, so the report's `queued_prefill_tokens` is 0; between two scrapes the router's
//! own accounting of what it routed there stands in (see `switchyard_router::load`).
//!
//! Only the exposition format's sample lines are read (`name{labels} value [timestamp]`);
//! comments, other metrics and malformed lines are skipped, so a newer vLLM adding metrics
//! changes nothing. A metric that is missing altogether is an error: the scrape is not used.

use switchyard_protocol::worker::{LoadReport, WorkerId};

/// Requests being computed.
pub const RUNNING: &str = "vllm:num_requests_running";
/// Requests queued.
pub const WAITING: &str = "vllm:num_requests_waiting";
/// Fraction of KV blocks in use.
pub const KV_USAGE: &str = "vllm:kv_cache_usage_perc";
/// Info gauge with the cache configuration in its labels.
pub const CACHE_CONFIG: &str = "vllm:cache_config_info";

/// What one scrape said.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VllmLoad {
    /// Requests being computed (all ranks).
    pub running: u32,
    /// Requests queued (all ranks).
    pub waiting: u32,
    /// Fraction of KV blocks in use, 0..=1 (mean over ranks).
    pub kv_usage: f64,
    /// KV capacity in blocks (all ranks), if `vllm:cache_config_info` says.
    pub num_gpu_blocks: Option<u64>,
    /// KV block size in tokens, if `vllm:cache_config_info` says.
    pub block_size: Option<u32>,
}

/// Why a scrape is not used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScrapeError {
    /// A gauge the load needs is not there (not a vLLM, or its metrics are off).
    #[error("no {0} in the metrics")]
    Missing(&'static str),
}

impl VllmLoad {
    /// Reads the load from exposition-format `text`.
    ///
    /// # Errors
    /// [`ScrapeError::Missing`] when a needed gauge is absent.
    pub fn parse(text: &str) -> Result<VllmLoad, ScrapeError> {
        let mut running = Sum::default();
        let mut waiting = Sum::default();
        let mut usage = Sum::default();
        let mut blocks = Sum::default();
        let mut block_size = None;
        for sample in text.lines().filter_map(Sample::parse) {
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
        Ok(VllmLoad {
            running: count(running.total().ok_or(ScrapeError::Missing(RUNNING))?),
            waiting: count(waiting.total().ok_or(ScrapeError::Missing(WAITING))?),
            kv_usage: usage
                .mean()
                .ok_or(ScrapeError::Missing(KV_USAGE))?
                .clamp(0.0, 1.0),
            num_gpu_blocks: blocks.total().map(|b| b as u64),
            block_size,
        })
    }

    /// The load report the router takes, for a worker of `capacity_blocks`.
    pub fn report(&self, worker_id: &WorkerId, capacity_blocks: u64) -> LoadReport {
        LoadReport {
            v: 1,
            worker_id: worker_id.clone(),
            running: self.running,
            waiting: self.waiting,
            kv_used_blocks: (self.kv_usage * capacity_blocks as f64).round() as u64,
            kv_total_blocks: capacity_blocks,
            queued_prefill_tokens: 0,
            kv_waiting_blocks: 0,
        }
    }
}

/// A gauge value as a count: non-negative, finite, saturating.
fn count(value: f64) -> u32 {
    if value.is_finite() && value > 0.0 {
        value.round().min(f64::from(u32::MAX)) as u32
    } else {
        0
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Sum {
    total: f64,
    series: u32,
}

impl Sum {
    fn add(&mut self, value: f64) {
        if value.is_finite() {
            self.total += value;
            self.series += 1;
        }
    }

    fn total(self) -> Option<f64> {
        (self.series > 0).then_some(self.total)
    }

    fn mean(self) -> Option<f64> {
        self.total().map(|t| t / f64::from(self.series))
    }
}

/// One sample line.
struct Sample<'a> {
    name: &'a str,
    labels: &'a str,
    value: f64,
}

impl<'a> Sample<'a> {
    fn parse(line: &'a str) -> Option<Sample<'a>> {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        let (name, labels, rest) = match line.find('{') {
            Some(open) => {
                let close = open + closing_brace(line.get(open..)?)?;
                (
                    line.get(..open)?,
                    line.get(open + 1..close)?,
                    line.get(close + 1..)?,
                )
            }
            None => {
                let (name, rest) = line.split_once(char::is_whitespace)?;
                (name, "", rest)
            }
        };
        let value = rest.split_whitespace().next()?.parse().ok()?;
        Some(Sample {
            name: name.trim(),
            labels,
            value,
        })
    }

    /// The value of label `key` (escapes are not undone: the labels read here are numbers).
    fn label(&self, key: &str) -> Option<&'a str> {
        let mut rest = self.labels;
        while !rest.is_empty() {
            let (k, after) = rest.split_once('=')?;
            let after = after.strip_prefix('"')?;
            let end = closing_quote(after)?;
            let value = after.get(..end)?;
            if k.trim() == key {
                return Some(value);
            }
            rest = after.get(end + 1..)?.trim_start_matches(',').trim_start();
        }
        None
    }
}

/// Offset of the `}` closing the label set that starts `text` (quotes respected).
fn closing_brace(text: &str) -> Option<usize> {
    let mut in_quotes = false;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if in_quotes => escaped = true,
            '"' => in_quotes = !in_quotes,
            '}' if !in_quotes => return Some(i),
            _ => {}
        }
    }
    None
}

/// Offset of the `"` ending a label value (after its opening quote).
fn closing_quote(text: &str) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => return Some(i),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn the_load_and_capacity_come_from_vllms_gauges() {
        let load = VllmLoad::parse(VLLM).unwrap();
        assert_eq!((load.running, load.waiting), (2, 5));
        assert!((load.kv_usage - 0.25).abs() < 1e-9);
        assert_eq!(load.num_gpu_blocks, Some(1000));
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
        let load = VllmLoad::parse(text).unwrap();
        assert_eq!(load.running, 4);
        assert!((load.kv_usage - 0.3).abs() < 1e-9);
        assert_eq!(load.num_gpu_blocks, Some(40));
    }

    #[test]
    fn missing_gauges_are_named_and_garbage_is_skipped() {
        assert_eq!(
            VllmLoad::parse("garbage\n{{{ 1\nvllm:num_requests_running"),
            Err(ScrapeError::Missing(RUNNING))
        );
        let text = "vllm:num_requests_running 1\nvllm:num_requests_waiting NaN\n";
        assert_eq!(VllmLoad::parse(text), Err(ScrapeError::Missing(WAITING)));
        let text = "vllm:num_requests_running -3\nvllm:num_requests_waiting 1e30\nvllm:kv_cache_usage_perc 7\n";
        let load = VllmLoad::parse(text).unwrap();
        assert_eq!((load.running, load.waiting), (0, u32::MAX), "clamped");
        assert_eq!(load.kv_usage, 1.0);
        assert_eq!(load.num_gpu_blocks, None);
    }

    #[test]
    fn quoted_braces_and_escapes_in_labels_do_not_confuse_the_reader() {
        let text = r#"vllm:cache_config_info{a="x}\"y",num_gpu_blocks="7"} 1"#;
        let sample = Sample::parse(text).unwrap();
        assert_eq!(sample.label("num_gpu_blocks"), Some("7"));
        assert_eq!(sample.label("a"), Some(r#"x}\"y"#));
        assert_eq!(sample.value, 1.0);
    }
}
