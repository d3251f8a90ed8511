//! TensorRT-LLM's load, from `trtllm-serve`'s `GET /metrics`: a JSON list of per-iteration
//! statistics (the worker started with `enable_iter_perf_stats: true`), drained on read —
//! each scrape sees the iterations since the last one. The last entry is the engine's
//! state now:
//! - `numActiveRequests`, `numQueuedRequests`: requests running / queued;
//! - `kvCacheStats.usedNumBlocks` / `kvCacheStats.maxNumBlocks`: KV blocks in use / in all
//!   (the capacity, when the pool file does not declare it);
//! - `kvCacheStats.tokensPerBlock`: the block size, checked against the pool file's.
//!
//! An engine with attention data parallelism tags entries with `attentionDpRank`: the last
//! entry of each rank counts, summed. An empty list means no iteration ran since the last
//! scrape: nothing is running or queued (a request in the engine makes it iterate), and the
//! capacity is not known from it.

use serde_json::Value;

use super::{EngineLoad, ScrapeError};

/// The numbers read from one entry.
#[derive(Debug, Default, Clone, Copy)]
struct Entry {
    active: u64,
    queued: u64,
    used_blocks: u64,
    max_blocks: u64,
    tokens_per_block: Option<u64>,
}

/// Reads the load from the JSON `text`.
///
/// # Errors
/// [`ScrapeError::NotStats`] for anything but a JSON list of objects,
/// [`ScrapeError::Missing`] or [`ScrapeError::Field`] when an entry lacks the numbers.
pub fn parse(text: &str) -> Result<EngineLoad, ScrapeError> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| ScrapeError::NotStats(e.to_string()))?;
    let Value::Array(entries) = value else {
        return Err(ScrapeError::NotStats("not a list".into()));
    };
    // The last entry of each rank, in the order the ranks first appear.
    let mut last: Vec<(Option<i64>, &Value)> = Vec::new();
    for entry in &entries {
        let rank = entry.get("attentionDpRank").and_then(Value::as_i64);
        match last.iter_mut().find(|(r, _)| *r == rank) {
            Some(slot) => slot.1 = entry,
            None => last.push((rank, entry)),
        }
    }
    let mut total = Entry::default();
    for (_, entry) in last {
        let e = read(entry)?;
        total.active = total.active.saturating_add(e.active);
        total.queued = total.queued.saturating_add(e.queued);
        total.used_blocks = total.used_blocks.saturating_add(e.used_blocks);
        total.max_blocks = total.max_blocks.saturating_add(e.max_blocks);
        total.tokens_per_block = total.tokens_per_block.or(e.tokens_per_block);
    }
    let clamp = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    Ok(EngineLoad {
        running: clamp(total.active),
        waiting: clamp(total.queued),
        kv_usage: if total.max_blocks > 0 {
            (total.used_blocks as f64 / total.max_blocks as f64).clamp(0.0, 1.0)
        } else {
            0.0
        },
        capacity_blocks: (total.max_blocks > 0).then_some(total.max_blocks),
        block_size: total
            .tokens_per_block
            .and_then(|t| u32::try_from(t).ok())
            .filter(|t| *t > 0),
        served_model: None,
    })
}

fn read(entry: &Value) -> Result<Entry, ScrapeError> {
    if !entry.is_object() {
        return Err(ScrapeError::NotStats("an entry is not an object".into()));
    }
    let number = |value: Option<&Value>, name: &'static str| -> Result<u64, ScrapeError> {
        let value = value.ok_or(ScrapeError::Missing(name))?;
        value
            .as_u64()
            .or_else(|| {
                value
                    .as_f64()
                    .filter(|f| f.is_finite() && *f >= 0.0)
                    .map(|f| f.round() as u64)
            })
            .ok_or(ScrapeError::Field(name))
    };
    let kv = entry.get("kvCacheStats");
    Ok(Entry {
        active: number(entry.get("numActiveRequests"), "numActiveRequests")?,
        queued: number(entry.get("numQueuedRequests"), "numQueuedRequests")?,
        used_blocks: number(
            kv.and_then(|k| k.get("usedNumBlocks")),
            "kvCacheStats.usedNumBlocks",
        )?,
        max_blocks: number(
            kv.and_then(|k| k.get("maxNumBlocks")),
            "kvCacheStats.maxNumBlocks",
        )?,
        tokens_per_block: kv
            .and_then(|k| k.get("tokensPerBlock"))
            .and_then(Value::as_u64),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(iter: u64, active: u64, queued: u64, used: u64) -> String {
        format!(
            r#"{{"iter": {iter}, "iterLatencyMS": 12.5, "gpuMemUsage": 1000, "numActiveRequests": {active},
              "numQueuedRequests": {queued}, "numCompletedRequests": 0, "maxNumActiveRequests": 64,
              "kvCacheStats": {{"maxNumBlocks": 2000, "freeNumBlocks": {free}, "usedNumBlocks": {used},
                "tokensPerBlock": 32, "allocTotalBlocks": 10, "allocNewBlocks": 2, "reusedBlocks": 8,
                "missedBlocks": 2, "cacheHitRate": 0.8}},
              "inflightBatchingStats": {{"numScheduledRequests": {active}, "numCtxTokens": 0,
                "numGenRequests": {active}, "numPausedRequests": 0}}}}"#,
            free = 2000 - used
        )
    }

    #[test]
    fn the_last_iteration_is_the_load() {
        let text = format!("[{}, {}]", entry(1, 9, 9, 1900), entry(2, 4, 1, 500));
        let load = parse(&text).unwrap();
        assert_eq!((load.running, load.waiting), (4, 1));
        assert!((load.kv_usage - 0.25).abs() < 1e-9);
        assert_eq!(load.capacity_blocks, Some(2000));
        assert_eq!(load.block_size, Some(32));
    }

    #[test]
    fn no_iteration_since_the_last_scrape_is_an_idle_engine() {
        let load = parse("[]").unwrap();
        assert_eq!((load.running, load.waiting, load.kv_usage), (0, 0, 0.0));
        assert_eq!((load.capacity_blocks, load.block_size), (None, None));
    }

    #[test]
    fn attention_dp_ranks_are_summed() {
        let rank =
            |r: u64, e: String| e.replacen('{', &format!(r#"{{"attentionDpRank": {r}, "#), 1);
        let text = format!(
            "[{}, {}, {}]",
            rank(0, entry(1, 1, 0, 100)),
            rank(1, entry(1, 2, 3, 300)),
            rank(0, entry(2, 5, 0, 200)),
        );
        let load = parse(&text).unwrap();
        assert_eq!((load.running, load.waiting), (7, 3));
        assert_eq!(load.capacity_blocks, Some(4000));
        assert!((load.kv_usage - 500.0 / 4000.0).abs() < 1e-9);
    }

    #[test]
    fn other_text_is_refused() {
        assert!(matches!(
            parse("vllm:num_requests_running 1"),
            Err(ScrapeError::NotStats(_))
        ));
        assert!(matches!(parse("{}"), Err(ScrapeError::NotStats(_))));
        assert!(matches!(parse("[1]"), Err(ScrapeError::NotStats(_))));
        assert_eq!(
            parse(r#"[{"numActiveRequests": 1, "numQueuedRequests": 0}]"#),
            Err(ScrapeError::Missing("kvCacheStats.usedNumBlocks"))
        );
        assert_eq!(
            parse(r#"[{"numActiveRequests": -1}]"#),
            Err(ScrapeError::Field("numActiveRequests"))
        );
    }
}
