//! A declared worker's load, read from its engine's metrics: pure, so each engine's format is
//! tested on text written here.
//!
//! None of the engines reports load to anyone; their metrics endpoints are the only view.
//! - vLLM ([`vllm`]) and SGLang ([`sglang`]): Prometheus text on `/metrics`.
//! - TensorRT-LLM ([`trtllm`]): a JSON list of iteration statistics on `/metrics`.
//!
//! None of them exports the prompt tokens it still has to prefill, so the report leaves
//! `queued_prefill_tokens` out, and the router's own accounting of what it routed there stands
//! alone (see `switchyard_router::load`; a 0 there wiped that accounting at every scrape). A metric the load needs that is
//! missing altogether is an error: the scrape is not used.

pub mod exposition;
pub mod sglang;
pub mod trtllm;
pub mod vllm;

use switchyard_protocol::worker::{Engine, LoadReport, WorkerId};

/// What one scrape said, whatever the engine.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineLoad {
    /// Requests being computed (all ranks).
    pub running: u32,
    /// Requests queued (all ranks).
    pub waiting: u32,
    /// Fraction of KV capacity in use, 0..=1.
    pub kv_usage: f64,
    /// KV capacity in blocks (all ranks), if the engine says.
    pub capacity_blocks: Option<u64>,
    /// KV block size in tokens, if the engine says.
    pub block_size: Option<u32>,
    /// The model name the engine serves under, if its metrics label it (vLLM's and SGLang's
    /// `model_name`): requests must name it.
    pub served_model: Option<String>,
}

/// Why a scrape is not used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScrapeError {
    /// A gauge the load needs is not there (another engine, or its metrics are off).
    #[error("no {0} in the metrics")]
    Missing(&'static str),
    /// TensorRT-LLM's statistics are not a JSON list.
    #[error("the metrics are not a JSON list of iteration statistics: {0}")]
    NotStats(String),
    /// A field of TensorRT-LLM's statistics has the wrong type.
    #[error("field {0} of the iteration statistics is not a non-negative number")]
    Field(&'static str),
}

impl EngineLoad {
    /// Reads the load of an `engine` worker from its metrics `text`; `block_size` (the pool
    /// file's) converts a capacity given in tokens.
    ///
    /// # Errors
    /// [`ScrapeError`] when the text does not carry the load.
    pub fn parse(engine: Engine, text: &str, block_size: u32) -> Result<EngineLoad, ScrapeError> {
        match engine {
            Engine::Vllm => vllm::parse(text),
            Engine::Sglang => sglang::parse(text, block_size),
            Engine::Trtllm => trtllm::parse(text),
        }
    }

    /// The load report the router takes, for a worker of `capacity_blocks`.
    pub fn report(&self, worker_id: &WorkerId, capacity_blocks: u64) -> LoadReport {
        LoadReport {
            v: 1,
            worker_id: worker_id.clone(),
            instance_id: None,
            running: self.running,
            waiting: self.waiting,
            kv_used_blocks: (self.kv_usage * capacity_blocks as f64).round() as u64,
            kv_total_blocks: capacity_blocks,
            queued_prefill_tokens: None,
            kv_waiting_blocks: 0,
        }
    }
}
