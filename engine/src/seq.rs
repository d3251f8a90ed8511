//! One request's state inside the engine. Token values are never stored: block hashes are
//! all the cache needs.

use switchyard_protocol::hash::{LocalBlockHash, SequenceHash};

use super::request::{EngineRequest, KvSource};

/// Where a request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Waiting,
    Running,
    /// Finished prefill leg whose KV is pinned for a decode worker.
    Held,
    /// Aborted while listed in the iteration in flight; freed when it ends.
    Aborted,
}

/// One request inside the engine.
#[derive(Debug)]
pub(super) struct Seq {
    pub(super) id: u64,
    pub(super) prompt_len: u32,
    pub(super) max_tokens: u32,
    /// Sequence hashes of the full blocks known so far: the prompt's, then synthetic ones for
    /// blocks completed by generated tokens (so a preempted request finds them again).
    pub(super) hashes: Vec<SequenceHash>,
    /// Physical blocks held, in sequence order.
    pub(super) blocks: Vec<u32>,
    /// Tokens whose KV is computed (vLLM `num_computed_tokens`).
    pub(super) computed: u32,
    /// Tokens generated.
    pub(super) output: u32,
    /// Leading blocks already offered to the cache for registration.
    pub(super) registered: u32,
    /// Prefix-cache hit at first scheduling, reported as `cached_tokens`.
    pub(super) cached_tokens: Option<u32>,
    /// Prompt KV arrives from a prefill worker at first scheduling.
    pub(super) remote_pending: bool,
    pub(super) remote_tokens: u32,
    pub(super) hold: bool,
    /// Whether prefix-cache hits count ([`crate::EngineRequest::reads_prefix_cache`]).
    pub(super) reads_cache: bool,
    pub(super) arrival_ms: f64,
    pub(super) rank: u32,
    pub(super) phase: Phase,
    /// Listed in the iteration in flight.
    pub(super) planned: bool,
}

impl Seq {
    /// A waiting sequence for `req`, whose prompt is `prompt_len` tokens hashed as `hashes`
    /// (the caller took the prompt out of `req` to hash it).
    pub(super) fn new(
        req: &EngineRequest,
        prompt_len: u32,
        max_tokens: u32,
        hashes: Vec<SequenceHash>,
        arrival_ms: f64,
    ) -> Self {
        Seq {
            id: req.id,
            prompt_len,
            max_tokens,
            hashes,
            blocks: Vec::new(),
            computed: 0,
            output: 0,
            registered: 0,
            cached_tokens: None,
            // KV handed over is not read either by a request that reads no cache (vLLM loads
            // nothing for it and computes the prompt).
            remote_pending: matches!(req.kv, KvSource::Remote) && req.reads_prefix_cache,
            reads_cache: req.reads_prefix_cache,
            remote_tokens: 0,
            hold: req.hold_for_remote_decode,
            arrival_ms,
            rank: 0,
            phase: Phase::Waiting,
            planned: false,
        }
    }

    /// Prompt plus generated tokens: what must be in KV before the next token is sampled.
    pub(super) fn num_tokens(&self) -> u32 {
        self.prompt_len + self.output
    }

    /// Tokens still to prefill: the prompt's uncomputed rest, or after a preemption the
    /// prompt and output to recompute; 0 for a request that only decodes (its one pending
    /// token is a decode step) or whose KV arrives from a prefill worker.
    pub(super) fn prefill_remaining(&self) -> u32 {
        if self.remote_pending {
            return 0;
        }
        let pending = self.num_tokens() - self.computed;
        if self.output > 0 {
            pending.saturating_sub(1)
        } else {
            pending
        }
    }
}

/// Local hash standing in for a block holding generated tokens (the simulation produces no
/// real tokens). Deterministic per request and position, so recompute after preemption hits.
pub(super) fn synthetic_local_hash(id: u64, block: usize) -> LocalBlockHash {
    let mut z = id ^ (block as u64).rotate_left(40) ^ 0x9e37_79b9_7f4a_7c15;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    LocalBlockHash(z ^ (z >> 31))
}
