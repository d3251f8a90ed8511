//! Prompt tokenization as the route API needs it, behind a small trait.
//!
//! The route handler needs "OpenAI body in, token ids out" and the difference between a bad
//! body (400, naming the field) and a broken tokenizer (500). [`PromptTokenizer`] is that
//! seam: production uses the model's real tokenizer and chat template
//! ([`ModelTokenizer`]); a test may pass something simpler.

use std::path::Path;

use switchyard_protocol::route::ApiKind;
use switchyard_protocol::tokenize::{ModelTokenizer, TokenizeError};

/// Why a prompt could not be tokenized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenizeFailure {
    /// The body is not a valid request for its API (answer 400 naming `field`).
    #[error("invalid request: {field}: {message}")]
    InvalidRequest {
        /// JSON path of the offending field, e.g. `messages[1].content`.
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// The tokenizer or chat template failed on a valid body (answer 500).
    #[error("tokenizer failed: {0}")]
    Internal(String),
}

/// Counters of the tokenizer's segment cache (cumulative since start).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SegmentCacheStats {
    /// Segments whose tokens were reused.
    pub hits: u64,
    /// Segments tokenized afresh.
    pub misses: u64,
}

/// Turns an OpenAI request body into the prompt's token ids, exactly as the worker will.
///
/// Implementations are called from blocking threads, several at once.
pub trait PromptTokenizer: Send + Sync + 'static {
    /// Tokenizes the prompt of `body` (a chat or completions request).
    ///
    /// # Errors
    /// [`TokenizeFailure::InvalidRequest`] for a body the API does not accept;
    /// [`TokenizeFailure::Internal`] when tokenization itself fails.
    fn tokenize(&self, api: ApiKind, body: &serde_json::Value)
        -> Result<Vec<u32>, TokenizeFailure>;

    /// Segment-cache counters, when the tokenizer keeps such a cache.
    fn cache_stats(&self) -> SegmentCacheStats {
        SegmentCacheStats::default()
    }

    /// The model's context length, when the tokenizer's model folder says.
    fn context_length(&self) -> Option<u32> {
        None
    }
}

/// Why the model's tokenizer could not be loaded at start.
#[derive(Debug, thiserror::Error)]
#[error("cannot load the tokenizer from {dir} (--model-dir / SWITCHYARD_MODEL_DIR, or a pool file model's model_dir): {message}")]
pub struct TokenizerLoadError {
    /// The directory tried.
    pub dir: String,
    /// What went wrong.
    pub message: String,
}

/// Loads the model's tokenizer and chat template from `dir`.
///
/// # Errors
/// [`TokenizerLoadError`] when the files are missing or invalid.
pub fn load_model_tokenizer(
    dir: &Path,
) -> Result<std::sync::Arc<dyn PromptTokenizer>, TokenizerLoadError> {
    match ModelTokenizer::from_dir(dir) {
        Ok(t) => Ok(std::sync::Arc::new(t)),
        Err(e) => Err(TokenizerLoadError {
            dir: dir.display().to_string(),
            message: e.to_string(),
        }),
    }
}

impl PromptTokenizer for ModelTokenizer {
    fn tokenize(
        &self,
        api: ApiKind,
        body: &serde_json::Value,
    ) -> Result<Vec<u32>, TokenizeFailure> {
        self.tokenize_request(api, body).map_err(|e| match e {
            TokenizeError::InvalidRequest { field, message } => {
                TokenizeFailure::InvalidRequest { field, message }
            }
            other => TokenizeFailure::Internal(other.to_string()),
        })
    }

    fn context_length(&self) -> Option<u32> {
        ModelTokenizer::context_length(self)
    }

    fn cache_stats(&self) -> SegmentCacheStats {
        let stats = ModelTokenizer::cache_stats(self);
        SegmentCacheStats {
            hits: stats.hits,
            misses: stats.misses,
        }
    }
}
