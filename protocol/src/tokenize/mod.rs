//! Prompt -> token ids, exactly as vLLM computes them (feature `tokenizer`).
//!
//! The control plane matches a request's token blocks against every worker's KV cache, so its
//! token ids must be the ones vLLM will compute: one differing token and every later block
//! hash misses. [`ModelTokenizer`] reproduces vLLM's path:
//!
//! - **chat**: the body is prepared as vLLM prepares it (content parts flattened, tool-call
//!   arguments parsed, tools serialized, developer messages made system messages for templates
//!   without that role; see `chat_request`), rendered with the model's Jinja chat template in
//!   an environment that behaves like transformers' (`template`, with Python's `json.dumps` as
//!   `tojson` in `pyjson`), and encoded without adding special tokens (vLLM's chat default).
//! - **completions**: a text prompt is encoded with the post-processor's special tokens
//!   (`add_special_tokens=True`); token-id prompts are used as given; a batch is routed by its
//!   first prompt (`completion_request`).
//!
//! Encoding goes through a **segment cache** (`segments`): text between added tokens
//! tokenizes independently, so each segment's ids are cached and a multi-turn request only
//! tokenizes its new messages. `docs/tokenization.md` has the details and what tests check.
//!
//! # Example
//! ```no_run
//! # use switchyard_protocol::{route::ApiKind, tokenize::{default_model_dir, ModelTokenizer}};
//! let tok = ModelTokenizer::from_dir(&default_model_dir())?;
//! let body = serde_json::json!({"messages": [{"role": "user", "content": "Hi"}]});
//! let ids = tok.tokenize_request(ApiKind::Chat, &body)?;
//! # Ok::<(), switchyard_protocol::tokenize::TokenizeError>(())
//! ```

mod bundle;
mod chat_messages;
mod chat_request;
mod chunks;
mod completion_request;
mod concat_output;
mod developer_role;
mod error;
mod model;
mod ordered;
mod planned;
mod probes;
mod pyformat;
mod pyjson;
mod segments;
mod strftime;
mod template;

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use tokenizers::Tokenizer;

use crate::route::ApiKind;
pub use bundle::TokenizerBundle;
use chat_request::{cut_after_final_message, prepare_chat};
use chunks::ChunkCutter;
pub use chunks::DEFAULT_CHUNK_BYTES;
use completion_request::{completion_prompts, prepare_completion, CompletionPrompt};
pub use error::TokenizeError;
pub use model::TokenizerFiles;
pub use planned::PlannedPrompt;
use probes::{chunks_exactly, special_wrap, splits_exactly, splitter_probes, SpecialWrap};
pub use segments::SegmentCacheStats;
use segments::{AddedTokenSplitter, SegmentCache};
use template::ChatTemplate;

/// Default segment cache budget. A cached token costs about 4 bytes (its id; chunks of ~1 KiB
/// add ~100 bytes each), so this holds the context of roughly 500 sessions at 32k tokens each.
pub const DEFAULT_CACHE_BYTES: usize = 64 << 20;

/// The model folder to use: `$SWITCHYARD_MODEL_DIR`, else the Qwen3 files `scripts/setup.sh`
/// puts in `.cache/models/qwen3` at the workspace root.
pub fn default_model_dir() -> PathBuf {
    match std::env::var_os("SWITCHYARD_MODEL_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../.cache/models/qwen3"
        )),
    }
}

/// A model's tokenizer and chat template. `Send + Sync`; share it with an `Arc`.
pub struct ModelTokenizer {
    tokenizer: Tokenizer,
    chat_template: Option<ChatTemplate>,
    tool_use_template: Option<ChatTemplate>,
    special_tokens: Vec<(&'static str, String)>,
    eos_token_id: Option<u32>,
    context_length: Option<u32>,
    /// The largest token id a prompt may hold.
    max_token_id: u32,
    splitter: AddedTokenSplitter,
    /// Ids the post-processor puts before and after a single text with
    /// `add_special_tokens=True`; `None` if they could not be derived (then such texts are
    /// encoded whole, uncached).
    special_wrap: Option<SpecialWrap>,
    /// Cuts long segments into chunks encoded (and cached) apart; `None` when the tokenizer is
    /// not one the cut is proven exact for (then segments are encoded whole).
    chunker: Option<ChunkCutter>,
    cache: SegmentCache,
}

// The control plane shares one tokenizer across request tasks.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ModelTokenizer>();
};

impl std::fmt::Debug for ModelTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelTokenizer")
            .field("vocab_size", &self.tokenizer.get_vocab_size(true))
            .field("has_chat_template", &self.chat_template.is_some())
            .field("segmented", &self.splitter.is_active())
            .field("cache", &self.cache.stats())
            .finish_non_exhaustive()
    }
}

impl ModelTokenizer {
    /// Loads a Hugging Face model folder with the default segment cache budget.
    ///
    /// # Errors
    /// [`TokenizeError::ModelDir`] if a file is missing or malformed, [`TokenizeError::Template`]
    /// if the chat template does not compile.
    pub fn from_dir(dir: &Path) -> Result<Self, TokenizeError> {
        Self::from_dir_with_cache_bytes(dir, DEFAULT_CACHE_BYTES)
    }

    /// Like [`ModelTokenizer::from_dir`] with a segment cache of about `cache_bytes` (0 turns
    /// caching off).
    ///
    /// # Errors
    /// As [`ModelTokenizer::from_dir`].
    pub fn from_dir_with_cache_bytes(
        dir: &Path,
        cache_bytes: usize,
    ) -> Result<Self, TokenizeError> {
        Self::build(model::load(dir)?, cache_bytes)
    }

    /// Builds the tokenizer from the texts of a model folder's files (a filter's VM has no
    /// folder: it gets them from the control plane, see [`TokenizerBundle`]). `origin` names
    /// where they came from in errors.
    ///
    /// # Errors
    /// As [`ModelTokenizer::from_dir`].
    pub fn from_files(
        files: &TokenizerFiles,
        origin: &Path,
        cache_bytes: usize,
    ) -> Result<Self, TokenizeError> {
        Self::build(model::parse(files, origin)?, cache_bytes)
    }

    fn build(files: model::ModelFiles, cache_bytes: usize) -> Result<Self, TokenizeError> {
        let compile = |t: &Option<String>| t.as_deref().map(ChatTemplate::compile).transpose();
        let eos_token_id = files
            .special_tokens
            .iter()
            .find(|(name, _)| *name == "eos_token")
            .and_then(|(_, token)| files.tokenizer.token_to_id(token));
        let mut splitter = AddedTokenSplitter::new(
            files
                .tokenizer
                .get_added_tokens_decoder()
                .iter()
                .map(|(id, token)| (*id, token)),
        );
        let probes = splitter_probes(&files.tokenizer);
        if !probes.is_empty() && !splits_exactly(&files.tokenizer, &splitter, &probes)? {
            // HF tokenizes the pieces between added tokens as separate inputs, so this only
            // trips for a tokenizer that breaks that assumption in some way not foreseen here:
            // stay exact by encoding every text whole.
            splitter = AddedTokenSplitter::default();
        }
        let special_wrap = special_wrap(&files.tokenizer)?;
        let chunker = exact_chunker(&files.tokenizer, DEFAULT_CHUNK_BYTES)?;
        Ok(ModelTokenizer {
            chat_template: compile(&files.chat_template)?,
            tool_use_template: compile(&files.tool_use_template)?,
            special_tokens: files.special_tokens,
            eos_token_id,
            context_length: files.context_length,
            max_token_id: files.max_token_id,
            splitter,
            special_wrap,
            chunker,
            cache: SegmentCache::new(cache_bytes),
            tokenizer: files.tokenizer,
        })
    }

    /// Token ids of an OpenAI request body, as vLLM would compute them.
    ///
    /// # Errors
    /// [`TokenizeError::InvalidRequest`] naming the field if the body is malformed (or the chat
    /// template rejects the conversation); other variants for server-side failures.
    pub fn tokenize_request(
        &self,
        api: ApiKind,
        body: &serde_json::Value,
    ) -> Result<Vec<u32>, TokenizeError> {
        self.finish(self.plan_request(api, body)?)
    }

    /// The cheap part of [`ModelTokenizer::tokenize_request`]: the body checked and rendered,
    /// cut into segments and chunks, and every chunk the segment cache holds looked up.
    /// [`ModelTokenizer::finish`] encodes the rest; [`PlannedPrompt::missing_bytes`] says how
    /// much that is, so a caller can finish a warm prompt where it is and hand a cold one to
    /// another thread.
    ///
    /// # Errors
    /// As [`ModelTokenizer::tokenize_request`].
    pub fn plan_request<'b>(
        &self,
        api: ApiKind,
        body: &'b serde_json::Value,
    ) -> Result<PlannedPrompt<'b>, TokenizeError> {
        match api {
            ApiKind::Chat => {
                let (text, add_special_tokens) = self.render_chat_inner(body)?;
                self.plan_text(Cow::Owned(text), add_special_tokens)
            }
            ApiKind::Completions => match prepare_completion(body, self.max_token_id)? {
                CompletionPrompt::Tokens(ids) => Ok(PlannedPrompt::ids(ids)),
                CompletionPrompt::Text {
                    text,
                    add_special_tokens,
                } => self.plan_text(Cow::Borrowed(text), add_special_tokens),
            },
        }
    }

    /// The token counts of a completions batch's prompts after the first, in order (empty
    /// unless it is a batch). A batch is routed by its first prompt, which
    /// [`ModelTokenizer::tokenize_request`] tokenized and checked, but served prompt by
    /// prompt: the caller checks each of these against the context too. Every prompt is
    /// validated as the first was; only the first is not tokenized again.
    ///
    /// # Errors
    /// As [`ModelTokenizer::tokenize_request`].
    pub fn later_completion_prompt_lengths(
        &self,
        body: &serde_json::Value,
    ) -> Result<Vec<usize>, TokenizeError> {
        completion_prompts(body, self.max_token_id)?
            .into_iter()
            .skip(1)
            .map(|prompt| match prompt {
                CompletionPrompt::Tokens(ids) => Ok(ids.len()),
                CompletionPrompt::Text {
                    text,
                    add_special_tokens,
                } => Ok(self
                    .finish(self.plan_text(Cow::Borrowed(text), add_special_tokens)?)?
                    .len()),
            })
            .collect()
    }

    /// The largest token id a prompt may hold (the tokenizer's or, from `config.json`, the
    /// model's vocabulary, whichever is larger).
    pub fn max_token_id(&self) -> u32 {
        self.max_token_id
    }

    /// The model's context length in tokens, when its folder says (`config.json`'s
    /// `max_position_embeddings`, else `tokenizer_config.json`'s `model_max_length`).
    pub fn context_length(&self) -> Option<u32> {
        self.context_length
    }

    /// The chat template's output for a chat body (`messages`, `tools`,
    /// `add_generation_prompt`, `chat_template_kwargs`, ...).
    ///
    /// # Errors
    /// As [`ModelTokenizer::tokenize_request`]; [`TokenizeError::Template`] if the model has no
    /// chat template.
    pub fn render_chat(&self, body: &serde_json::Value) -> Result<String, TokenizeError> {
        self.render_chat_inner(body).map(|(text, _)| text)
    }

    fn render_chat_inner(&self, body: &serde_json::Value) -> Result<(String, bool), TokenizeError> {
        let has_tools = body.get("tools").is_some_and(|t| !t.is_null());
        let template = match (&self.tool_use_template, &self.chat_template) {
            (Some(tool_use), _) if has_tools => tool_use,
            (_, Some(default)) => default,
            _ => {
                return Err(TokenizeError::Template(
                    "the model has no chat template".into(),
                ))
            }
        };
        let chat = prepare_chat(body, &self.special_tokens, template.knows_developer_role())?;
        let mut text = template.render(chat.context)?;
        if let Some(final_content) = &chat.continue_final {
            text = cut_after_final_message(text, final_content)?;
        }
        Ok((text, chat.add_special_tokens))
    }

    /// Encodes text without adding special tokens; special tokens written in the text are
    /// recognised. Goes through the segment cache.
    ///
    /// # Errors
    /// [`TokenizeError::Tokenizer`] if the HF tokenizer fails.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizeError> {
        self.finish(self.plan_text(Cow::Borrowed(text), false)?)
    }

    /// Encodes `text` in one call to the HF tokenizer, bypassing the segment cache: the
    /// reference the cached path is tested against, and what vLLM itself runs.
    ///
    /// # Errors
    /// [`TokenizeError::Tokenizer`] if the HF tokenizer fails.
    pub fn encode_uncached(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, TokenizeError> {
        let encoding = self
            .tokenizer
            .encode_fast(text, add_special_tokens)
            .map_err(|e| TokenizeError::Tokenizer(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Sets the chunk size long segments are cut to (0: never cut). Cutting stays off for a
    /// tokenizer it is not proven exact for, whatever the size.
    ///
    /// # Errors
    /// [`TokenizeError::Tokenizer`] if the load-time probes cannot be encoded.
    pub fn with_chunk_bytes(mut self, chunk_bytes: usize) -> Result<Self, TokenizeError> {
        self.chunker = exact_chunker(&self.tokenizer, chunk_bytes)?;
        Ok(self)
    }

    /// Whether long segments are cut into chunks (see [`DEFAULT_CHUNK_BYTES`]).
    pub fn chunks_segments(&self) -> bool {
        self.chunker.is_some()
    }

    /// Decodes ids to text, special tokens included.
    ///
    /// # Errors
    /// [`TokenizeError::Tokenizer`] if the HF tokenizer fails (e.g. an unknown id).
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizeError> {
        self.tokenizer
            .decode(ids, false)
            .map_err(|e| TokenizeError::Tokenizer(e.to_string()))
    }

    /// The id of the config's `eos_token`, if it has one.
    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos_token_id
    }

    /// The id of a vocabulary entry (in the tokenizer's own spelling, e.g. `Ġthe` for " the" in
    /// byte-level BPE) or an added token. To find words that encode to exactly one token, use
    /// [`ModelTokenizer::encode`] and check the length.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    /// The vocabulary entry of an id.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.tokenizer.id_to_token(id)
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    /// Whether chat requests can be rendered.
    pub fn has_chat_template(&self) -> bool {
        self.chat_template.is_some()
    }

    /// Segment cache counters.
    pub fn cache_stats(&self) -> SegmentCacheStats {
        self.cache.stats()
    }
}

/// The chunk cutter for `tokenizer` at `chunk_bytes`, if its configuration is one the cut is
/// proven exact for and the load-time probes agree.
fn exact_chunker(
    tokenizer: &Tokenizer,
    chunk_bytes: usize,
) -> Result<Option<ChunkCutter>, TokenizeError> {
    let Some(cutter) = ChunkCutter::for_tokenizer(tokenizer, chunk_bytes) else {
        return Ok(None);
    };
    Ok(chunks_exactly(tokenizer, cutter.finest())?.then_some(cutter))
}
