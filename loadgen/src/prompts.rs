//! Token-exact prompt synthesis.
//!
//! A prompt is a list of [`Segment`]s: `tokens` tokens of content block `block`. The content
//! of a block is a deterministic word stream derived from `(content seed, block id)`, so equal
//! block ids give equal token blocks, and a shorter segment of a block is a prefix of a longer
//! one (the Mooncake trace's partial last block and the same block in full share their start).
//! Every word is one token ([`Vocabulary`]), so a segment of `n` words is `n` tokens and a
//! prefix cache sees exactly the reuse the workload describes.
//!
//! The first two words of a block encode its id (a bijection on `id mod 2^18`), so blocks with
//! different ids differ by their second token at the latest: prompts that share `k` segments
//! share `sum(tokens)` of them plus at most one accidental token, never a whole extra KV block.
//!
//! Requests carry the synthesized text as **one user message** (`chat`) or as the `prompt`
//! (`completions`). For chat the template wraps the content in fixed tokens
//! ([`PromptFraming`]); the prefix is the same for every request, so sharing is preserved and
//! every boundary moves by the same `prefix_tokens`.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use switchyard_protocol::route::ApiKind;

use super::tokenizer::TextTokenizer;
use super::vocab::{Vocabulary, VOCABULARY_SIZE};
use super::PlannedRequest;

/// Number of block ids the two header words tell apart.
const HEADER_SPACE: u64 = (VOCABULARY_SIZE * VOCABULARY_SIZE) as u64;

/// `tokens` tokens from the start of content block `block`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Segment {
    /// Content block id (a Mooncake hash id, or an id the agentic generator allocates).
    pub block: u64,
    /// Tokens taken from the start of the block's word stream.
    pub tokens: u32,
}

/// A prompt's content as a list of block segments.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptSpec {
    /// Segments in prompt order.
    pub segments: Vec<Segment>,
}

impl PromptSpec {
    /// A prompt of `(block, tokens)` segments, for tests.
    #[cfg(test)]
    pub(crate) fn of(segments: &[(u64, u32)]) -> Self {
        PromptSpec {
            segments: segments
                .iter()
                .map(|&(block, tokens)| Segment { block, tokens })
                .collect(),
        }
    }

    /// Total content tokens.
    pub fn tokens(&self) -> u64 {
        self.segments.iter().map(|s| u64::from(s.tokens)).sum()
    }

    /// Vocabulary indices of the prompt's words, in order.
    pub fn word_indices(&self, content_seed: u64) -> impl Iterator<Item = usize> + '_ {
        self.segments.iter().flat_map(move |s| {
            (0..s.tokens).map(move |position| block_word(content_seed, s.block, position))
        })
    }

    /// The prompt's text: one vocabulary word (leading space included) per token.
    pub fn text(&self, vocab: &Vocabulary, content_seed: u64) -> String {
        let mut text = String::with_capacity(self.tokens() as usize * 7);
        for index in self.word_indices(content_seed) {
            text.push_str(vocab.word(index));
        }
        text
    }

    /// The prompt's content token ids under `vocab`'s tokenizer (template tokens excluded).
    pub fn token_ids(&self, vocab: &Vocabulary, content_seed: u64) -> Vec<u32> {
        self.word_indices(content_seed)
            .map(|i| vocab.id(i))
            .collect()
    }
}

/// Vocabulary index of word `position` of content block `block`.
///
/// Positions 0 and 1 encode `block` (high and low 9 bits of an odd-multiplier permutation of
/// `block mod 2^18`); later positions are SplitMix64 of `(seed, block, position)`, which is
/// stable across Rust and crate versions, unlike library RNGs.
pub fn block_word(content_seed: u64, block: u64, position: u32) -> usize {
    let size = VOCABULARY_SIZE as u64;
    match position {
        0 | 1 => {
            let permuted = block
                .wrapping_mul(0x9E37_79B9)
                .wrapping_add(splitmix64(content_seed))
                % HEADER_SPACE;
            let word = if position == 0 {
                permuted / size
            } else {
                permuted % size
            };
            word as usize
        }
        _ => {
            let mixed = splitmix64(content_seed ^ splitmix64(block)) ^ u64::from(position);
            (splitmix64(mixed) % size) as usize
        }
    }
}

/// SplitMix64 finaliser: a fixed, well-mixed 64-bit hash.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Errors measuring how a request body frames the content.
#[derive(Debug, thiserror::Error)]
pub enum FramingError {
    /// The tokenizer failed on the probe request.
    #[error("tokenizer failed on the probe request: {0}")]
    Tokenizer(String),
    /// The template or tokenizer merged content tokens with their surroundings, so token
    /// counts would not be exact.
    #[error(
        "the {api} request does not contain the content's {content} tokens verbatim \
         ({total} tokens in all); prompts would not be token-exact with this tokenizer"
    )]
    ContentNotVerbatim {
        /// API probed.
        api: &'static str,
        /// Content tokens in the probe.
        content: usize,
        /// Tokens of the whole probe request.
        total: usize,
    },
}

/// The fixed tokens a request body puts around the content: the chat template's, or nothing
/// for completions. Measured once per run; with it a request's full token ids follow without
/// tokenizing it (what a virtual-time replay needs to be exact).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptFraming {
    /// Token ids before the content (chat: `<|im_start|>user\n` and the like).
    pub prefix: Vec<u32>,
    /// Token ids after the content (chat: end of turn and the assistant generation prompt).
    pub suffix: Vec<u32>,
}

impl PromptFraming {
    /// No framing: the prompt is the content (completions with a tokenizer that adds no BOS).
    pub fn none() -> Self {
        PromptFraming::default()
    }

    /// Measures the framing by tokenizing a probe body and finding its content verbatim.
    ///
    /// # Errors
    /// [`FramingError`] if the tokenizer fails or the content's tokens do not appear verbatim.
    pub fn measure(
        tokenizer: &dyn TextTokenizer,
        builder: &BodyBuilder,
    ) -> Result<Self, FramingError> {
        let probe = PromptSpec {
            segments: vec![Segment {
                block: 1,
                tokens: 32,
            }],
        };
        let content = probe.token_ids(&builder.vocab, builder.content_seed);
        let body = builder.body_for(&probe, 1);
        let all = tokenizer
            .tokenize_body(builder.api, &body)
            .map_err(FramingError::Tokenizer)?;
        let not_verbatim = || FramingError::ContentNotVerbatim {
            api: builder.api.as_str(),
            content: content.len(),
            total: all.len(),
        };
        let start = all
            .windows(content.len())
            .position(|w| w == content.as_slice())
            .ok_or_else(not_verbatim)?;
        Ok(PromptFraming {
            prefix: all[..start].to_vec(),
            suffix: all[start + content.len()..].to_vec(),
        })
    }

    /// Tokens before the content.
    pub fn prefix_tokens(&self) -> u32 {
        self.prefix.len() as u32
    }

    /// Tokens after the content.
    pub fn suffix_tokens(&self) -> u32 {
        self.suffix.len() as u32
    }

    /// Tokens the server should count for a prompt of `content_tokens` tokens.
    pub fn prompt_tokens(&self, content_tokens: u64) -> u64 {
        (self.prefix.len() + self.suffix.len()) as u64 + content_tokens
    }

    /// The whole prompt's token ids as the server computes them: prefix, content, suffix.
    pub fn token_ids(
        &self,
        prompt: &PromptSpec,
        vocab: &Vocabulary,
        content_seed: u64,
    ) -> Vec<u32> {
        let mut ids = Vec::with_capacity(self.prompt_tokens(prompt.tokens()) as usize);
        ids.extend_from_slice(&self.prefix);
        ids.extend(prompt.word_indices(content_seed).map(|i| vocab.id(i)));
        ids.extend_from_slice(&self.suffix);
        ids
    }
}

/// Renders planned requests into OpenAI request bodies.
///
/// Bodies are built when a request is sent, not stored in the workload: a one-hour Mooncake
/// trace is ~145 M prompt tokens, about 1 GB of text.
#[derive(Debug, Clone)]
pub struct BodyBuilder {
    /// Chat (one user message) or completions (`prompt`).
    pub api: ApiKind,
    /// Value of the `model` field.
    pub model: String,
    /// Words prompts are written in.
    pub vocab: Vocabulary,
    /// Content seed of the workload.
    pub content_seed: u64,
}

impl BodyBuilder {
    /// The streaming request body for `request`.
    pub fn body(&self, request: &PlannedRequest) -> Value {
        self.body_for(&request.prompt, request.osl)
    }

    /// The streaming request body for a prompt and an output length.
    ///
    /// `max_tokens` = `min_tokens` = `osl` with `ignore_eos` (vLLM's sampling extensions) so
    /// the server generates exactly the planned output length; `stream_options.include_usage`
    /// makes the server send token counts (and cached tokens) in a final chunk.
    pub fn body_for(&self, prompt: &PromptSpec, osl: u32) -> Value {
        let text = prompt.text(&self.vocab, self.content_seed);
        let mut body = json!({ "model": self.model });
        match self.api {
            ApiKind::Chat => body["messages"] = json!([{ "role": "user", "content": text }]),
            ApiKind::Completions => body["prompt"] = Value::String(text),
        }
        body["max_tokens"] = json!(osl);
        body["min_tokens"] = json!(osl);
        body["ignore_eos"] = json!(true);
        body["stream"] = json!(true);
        body["stream_options"] = json!({ "include_usage": true });
        body
    }

    /// The URL path of the API.
    pub fn path(&self) -> &'static str {
        match self.api {
            ApiKind::Chat => "/v1/chat/completions",
            ApiKind::Completions => "/v1/completions",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_blocks_give_equal_words_and_partial_blocks_are_prefixes() {
        let full: Vec<_> = PromptSpec::of(&[(7, 512)]).word_indices(3).collect();
        let partial: Vec<_> = PromptSpec::of(&[(7, 100)]).word_indices(3).collect();
        assert_eq!(full.len(), 512);
        assert_eq!(&full[..100], &partial[..]);
        let other_seed: Vec<_> = PromptSpec::of(&[(7, 512)]).word_indices(4).collect();
        assert_ne!(full, other_seed);
    }

    #[test]
    fn distinct_blocks_differ_within_two_tokens() {
        for a in 0..300u64 {
            for b in (a + 1)..300 {
                let wa = (block_word(9, a, 0), block_word(9, a, 1));
                let wb = (block_word(9, b, 0), block_word(9, b, 1));
                assert_ne!(wa, wb, "blocks {a} and {b}");
            }
        }
    }

    #[test]
    fn words_cover_the_vocabulary() {
        let mut seen = vec![false; VOCABULARY_SIZE];
        for i in PromptSpec::of(&[(1, 20_000)]).word_indices(0) {
            seen[i] = true;
        }
        assert!(seen.iter().all(|s| *s));
    }

    #[test]
    fn text_has_one_word_per_token() {
        let vocab = Vocabulary::synthetic();
        let s = PromptSpec::of(&[(1, 10), (2, 5)]);
        let text = s.text(&vocab, 0);
        assert_eq!(text.split(' ').filter(|w| !w.is_empty()).count(), 15);
        assert_eq!(s.token_ids(&vocab, 0).len(), 15);
    }

    #[test]
    fn body_carries_streaming_and_length_fields() {
        let builder = BodyBuilder {
            api: ApiKind::Chat,
            model: "m".into(),
            vocab: Vocabulary::synthetic(),
            content_seed: 1,
        };
        let body = builder.body_for(&PromptSpec::of(&[(1, 4)]), 17);
        assert_eq!(body["messages"][0]["role"], "user");
        assert_eq!(body["max_tokens"], 17);
        assert_eq!(body["ignore_eos"], true);
        assert_eq!(body["stream_options"]["include_usage"], true);
        let completions = BodyBuilder {
            api: ApiKind::Completions,
            ..builder
        };
        assert!(completions.body_for(&PromptSpec::of(&[(1, 4)]), 1)["prompt"].is_string());
    }
}
