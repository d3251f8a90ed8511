//! What callers submit to the engine: a prompt (token ids, or just its length and block
//! hashes for trace replay), an output length, and where the prompt's KV comes from.

use switchyard_protocol::hash::{self, BlockSize, HashSeed, SequenceHash};

/// A prompt as the engine needs it. The engine never looks at token values beyond hashing
/// them, so a trace replayer can skip token ids entirely and pass precomputed block hashes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    /// Real token ids; the engine hashes them with its block size and seed (protocol
    /// [`hash::sequence_hashes`], the same hashes the router computes) and drops them.
    Tokens(Vec<u32>),
    /// A prompt known only by its length and the sequence hashes of its full blocks
    /// (`block_hashes.len()` must equal `tokens / block_size`).
    Hashed {
        /// Prompt length in tokens.
        tokens: u32,
        /// Sequence hash of each full block, in order.
        block_hashes: Vec<SequenceHash>,
    },
}

impl Prompt {
    /// Prompt length in tokens.
    pub fn len(&self) -> u32 {
        match self {
            Prompt::Tokens(t) => u32::try_from(t.len()).unwrap_or(u32::MAX),
            Prompt::Hashed { tokens, .. } => *tokens,
        }
    }

    /// Whether the prompt has no tokens (the engine rejects such requests).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sequence hashes of the prompt's full blocks.
    pub fn block_hashes(&self, block_size: BlockSize, seed: HashSeed) -> Vec<SequenceHash> {
        match self {
            Prompt::Tokens(t) => hash::sequence_hashes(t, block_size, seed),
            Prompt::Hashed { block_hashes, .. } => block_hashes.clone(),
        }
    }
}

/// Where a request's prompt KV comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvSource {
    /// Computed here: prefix-cache hits plus prefill of the rest.
    #[default]
    Local,
    /// Already transferred into this worker by a prefill worker (simulated: the caller has
    /// waited [`super::Engine::transfer_time_ms`]). The prompt's blocks are allocated and marked
    /// computed without prefill compute, Stored events are emitted, and the request decodes.
    Remote,
}

/// One generation request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineRequest {
    /// Caller's id, unique among the engine's live requests (running, waiting or held).
    pub id: u64,
    /// The prompt.
    pub prompt: Prompt,
    /// Tokens to generate (at least 1). Simulated generation never stops early (no EOS).
    pub max_tokens: u32,
    /// Where the prompt KV comes from.
    pub kv: KvSource,
    /// Prefill leg of a disaggregated request (vLLM `do_remote_decode`): generate one token,
    /// then keep the prompt's blocks pinned until [`super::Engine::release_held`] or the
    /// lease expires, so the decode worker can pull them.
    pub hold_for_remote_decode: bool,
    /// Whether the prompt may start from cached KV (prefix-cache hits, or KV a prefill worker
    /// handed over). `false` for a request asking prompt logprobs: vLLM then reads no cached
    /// prefix and computes the whole prompt, since a cached prefix's logprobs were never kept.
    pub reads_prefix_cache: bool,
}

impl EngineRequest {
    /// An ordinary request that prefills locally.
    pub fn local(id: u64, prompt: Prompt, max_tokens: u32) -> Self {
        EngineRequest {
            id,
            prompt,
            max_tokens,
            kv: KvSource::Local,
            hold_for_remote_decode: false,
            reads_prefix_cache: true,
        }
    }

    /// The same request computing its whole prompt, whatever is cached (prompt logprobs).
    #[must_use]
    pub fn recomputing(self) -> Self {
        EngineRequest {
            reads_prefix_cache: false,
            ..self
        }
    }

    /// The prefill leg of a disaggregated request: one token, KV held for the decode worker.
    pub fn prefill_for_remote_decode(id: u64, prompt: Prompt) -> Self {
        EngineRequest {
            id,
            prompt,
            max_tokens: 1,
            kv: KvSource::Local,
            hold_for_remote_decode: true,
            reads_prefix_cache: true,
        }
    }

    /// The decode leg of a disaggregated request: prompt KV already transferred.
    pub fn decode_with_remote_kv(id: u64, prompt: Prompt, max_tokens: u32) -> Self {
        EngineRequest {
            id,
            prompt,
            max_tokens,
            kv: KvSource::Remote,
            hold_for_remote_decode: false,
            reads_prefix_cache: true,
        }
    }
}
