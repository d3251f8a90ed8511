//! The exact token ids of a planned request, made when it arrives.
//!
//! The router must hash the prompt exactly as it would behind Envoy, so the replay routes
//! with real token ids: the content words of [`switchyard_loadgen::prompts`] under a
//! [`Vocabulary`], wrapped in the request [`PromptFraming`] (chat-template tokens, or none).
//! With the vocabulary and framing of the real tokenizer these are the ids the control plane
//! computes from the load generator's request bodies. Ids are made per request at its
//! arrival and dropped after routing (a one-hour Mooncake trace is ~145 M prompt tokens); the
//! engines get only the block hashes.

use switchyard_protocol::hash::{sequence_hashes, BlockSize, HashSeed, SequenceHash};

use switchyard_engine::Prompt;
use switchyard_loadgen::prompts::PromptFraming;
use switchyard_loadgen::vocab::Vocabulary;
use switchyard_loadgen::PlannedRequest;

/// Renders planned requests into token ids.
#[derive(Debug, Clone)]
pub struct PromptSource {
    /// Words of the synthesized content and their token ids.
    pub vocab: Vocabulary,
    /// Tokens around the content (chat template), as the server tokenizes a body.
    pub framing: PromptFraming,
    /// The workload's content seed.
    pub content_seed: u64,
}

impl PromptSource {
    /// Synthetic token ids (word index = id) and no framing: the token structure of the real
    /// run (lengths, shared blocks) without needing a tokenizer. Prompt lengths then equal
    /// the trace's `input_length` exactly.
    pub fn synthetic(content_seed: u64) -> Self {
        PromptSource {
            vocab: Vocabulary::synthetic(),
            framing: PromptFraming::none(),
            content_seed,
        }
    }

    /// The whole prompt's token ids as the server sees them.
    pub fn token_ids(&self, request: &PlannedRequest) -> Vec<u32> {
        self.framing
            .token_ids(&request.prompt, &self.vocab, self.content_seed)
    }

    /// Prompt tokens the server counts for `request` (content plus framing).
    pub fn prompt_tokens(&self, request: &PlannedRequest) -> u64 {
        self.framing.prompt_tokens(request.isl())
    }
}

/// The engine's view of a prompt: its length and the protocol sequence hashes of its full
/// blocks, computed exactly as the router (and a real worker) computes them.
pub fn hashed_prompt(tokens: &[u32], block_size: BlockSize, seed: HashSeed) -> Prompt {
    let block_hashes: Vec<SequenceHash> = sequence_hashes(tokens, block_size, seed);
    Prompt::Hashed {
        tokens: u32::try_from(tokens.len()).unwrap_or(u32::MAX),
        block_hashes,
    }
}
