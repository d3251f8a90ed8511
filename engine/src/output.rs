//! What the engine reports: per-token outputs at iteration ends, load snapshots, and the KV
//! a prefill worker holds for a decode worker.

use switchyard_protocol::worker::{LoadReport, WorkerId};

/// Why a request finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// Generated `max_tokens` tokens (vLLM `"length"`; the simulation has no EOS).
    Length,
}

impl FinishReason {
    /// The OpenAI `finish_reason` string.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Length => "length",
        }
    }
}

/// One thing that happened at the end of an iteration (times are the caller's clock, ms).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EngineOutput {
    /// The request's first output token.
    FirstToken {
        /// Request id.
        id: u64,
        /// Prompt tokens served from the local prefix cache (vLLM's
        /// `usage.prompt_tokens_details.cached_tokens`).
        cached_tokens: u32,
        /// Prompt tokens in all (the prompt is done with here, as vLLM counts it).
        prompt_tokens: u32,
        /// Prompt tokens whose KV came from a prefill worker.
        remote_tokens: u32,
        /// When (iteration end).
        at_ms: f64,
    },
    /// A later output token (only when [`super::EngineConfig::emit_token_outputs`]).
    Token {
        /// Request id.
        id: u64,
        /// When (iteration end).
        at_ms: f64,
    },
    /// The request is done; follows its last token in the same iteration.
    Finished {
        /// Request id.
        id: u64,
        /// Prompt length.
        prompt_tokens: u32,
        /// Tokens generated.
        completion_tokens: u32,
        /// Prompt tokens served from the local prefix cache at first scheduling.
        cached_tokens: u32,
        /// Prompt tokens whose KV arrived from a prefill worker ([`super::KvSource::Remote`]).
        remote_tokens: u32,
        /// When (iteration end).
        at_ms: f64,
        /// Why.
        reason: FinishReason,
        /// The prompt's KV stays pinned for a remote decode ([`super::Engine::held_kv`]).
        kv_held: bool,
    },
    /// The request lost its KV to make room (vLLM recompute preemption) and went back to the
    /// queue; it resumes later, recomputing its prompt and the tokens generated so far.
    Preempted {
        /// Request id.
        id: u64,
        /// When (start of the iteration that needed the room).
        at_ms: f64,
    },
}

impl EngineOutput {
    /// The request this output belongs to.
    pub fn id(&self) -> u64 {
        match *self {
            EngineOutput::FirstToken { id, .. }
            | EngineOutput::Token { id, .. }
            | EngineOutput::Finished { id, .. }
            | EngineOutput::Preempted { id, .. } => id,
        }
    }

    /// When it happened.
    pub fn at_ms(&self) -> f64 {
        match *self {
            EngineOutput::FirstToken { at_ms, .. }
            | EngineOutput::Token { at_ms, .. }
            | EngineOutput::Finished { at_ms, .. }
            | EngineOutput::Preempted { at_ms, .. } => at_ms,
        }
    }
}

/// Result of [`super::Engine::step`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepOutcome {
    /// Outputs of every iteration that ended, in time order.
    pub outputs: Vec<EngineOutput>,
    /// Iterations that ended.
    pub iterations: u32,
}

/// Prompt KV a prefill worker keeps for a decode worker to pull.
#[derive(Debug, Clone, PartialEq)]
pub struct HeldKv {
    /// Request id.
    pub id: u64,
    /// Prompt length in tokens.
    pub prompt_tokens: u32,
    /// Physical block numbers holding the prompt (vLLM's `remote_block_ids`).
    pub block_ids: Vec<u32>,
    /// When the prefill finished.
    pub held_since_ms: f64,
    /// When the lease runs out and the blocks become ordinary cached blocks.
    pub expires_at_ms: f64,
}

/// The engine's load, as a vLLM worker's `/metrics` would show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LoadSnapshot {
    /// Requests scheduled (prefilling or decoding).
    pub running: u32,
    /// Requests queued (including preempted ones).
    pub waiting: u32,
    /// Prefill legs whose KV is held for a decode worker.
    pub held: u32,
    /// Blocks referenced by running or held requests (vLLM's `kv_cache_usage_perc` counts
    /// these; unreferenced cached blocks count as free).
    pub kv_used_blocks: u64,
    /// Unreferenced blocks that still hold reusable prefix KV.
    pub kv_cached_blocks: u64,
    /// KV capacity in blocks.
    pub kv_total_blocks: u64,
    /// Blocks the waiting requests need to be admitted, at most (whole sequences, prefix
    /// hits not taken off).
    pub kv_waiting_blocks: u64,
    /// Prompt tokens still to prefill (waiting requests' uncached remainder is estimated as
    /// their whole prompt; running requests' exact remainder).
    pub queued_prefill_tokens: u64,
    /// Prompt tokens looked up in the prefix cache (first scheduling of each request).
    pub prefix_cache_queries: u64,
    /// Of those, tokens found.
    pub prefix_cache_hits: u64,
    /// Preemptions so far.
    pub preemptions: u64,
    /// Iterations run so far.
    pub iterations: u64,
}

impl LoadSnapshot {
    /// KV usage in [0, 1] (vLLM `kv_cache_usage_perc`).
    pub fn kv_usage(&self) -> f64 {
        if self.kv_total_blocks == 0 {
            return 0.0;
        }
        self.kv_used_blocks as f64 / self.kv_total_blocks as f64
    }

    /// The wire load report of process `instance_id` of worker `worker_id`.
    pub fn to_load_report(&self, worker_id: WorkerId, instance_id: u64) -> LoadReport {
        LoadReport {
            v: switchyard_protocol::PROTOCOL_VERSION,
            worker_id,
            instance_id: Some(instance_id),
            running: self.running,
            waiting: self.waiting,
            kv_used_blocks: self.kv_used_blocks,
            kv_total_blocks: self.kv_total_blocks,
            queued_prefill_tokens: Some(self.queued_prefill_tokens),
            kv_waiting_blocks: self.kv_waiting_blocks,
        }
    }
}
