//! Why the engine refuses requests and configurations.

/// Why the engine refused a request or a configuration.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    /// The configuration is unusable; the message names the field.
    #[error("invalid engine config: {0}")]
    InvalidConfig(String),
    /// A live request (running, waiting or held) already has this id.
    #[error("request {id} is already in the engine")]
    DuplicateId {
        /// The id.
        id: u64,
    },
    /// A prompt of zero tokens.
    #[error("request {id} has an empty prompt")]
    EmptyPrompt {
        /// The id.
        id: u64,
    },
    /// `max_tokens` of zero (vLLM requires at least 1).
    #[error("request {id} asks for 0 tokens; max_tokens must be at least 1")]
    ZeroMaxTokens {
        /// The id.
        id: u64,
    },
    /// A [`Prompt::Hashed`] whose hash count does not match its length.
    #[error("request {id}: {tokens} tokens make {expected} full blocks but {got} block hashes were given")]
    BlockHashCount {
        /// The id.
        id: u64,
        /// Prompt length.
        tokens: u32,
        /// `tokens / block_size`.
        expected: usize,
        /// Hashes given.
        got: usize,
    },
    /// Prompt plus output can never fit in this engine's KV cache.
    #[error("request {id} needs {tokens} tokens of KV but the cache holds {capacity_tokens}")]
    ExceedsKvCapacity {
        /// The id.
        id: u64,
        /// Prompt + max_tokens.
        tokens: u64,
        /// Capacity in tokens.
        capacity_tokens: u64,
    },
    /// A time that is not a finite number.
    #[error("time must be a finite number of milliseconds, got {0}")]
    InvalidTime(f64),
}
