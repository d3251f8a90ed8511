//! Prompt tokenization as the route API needs it, behind a small trait.
//!
//! The route handler needs "OpenAI body in, token ids out" and the difference between a bad
//! body (400, naming the field) and a broken tokenizer (500). [`PromptTokenizer`] is that
//! seam: production uses the model's real tokenizer and chat template
//! ([`ModelTokenizer`]); a test may pass something simpler.

use std::path::Path;
use std::sync::Arc;

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

/// What [`PromptTokenizer::tokenize_here`] leaves to do.
pub enum Tokenizing {
    /// Finished on the calling thread.
    Done(Result<Vec<u32>, TokenizeFailure>),
    /// The rest of the work, for a blocking thread.
    Rest(Box<dyn FnOnce() -> Result<Vec<u32>, TokenizeFailure> + Send>),
}

impl Tokenizing {
    /// All of `body`'s tokenization, for a blocking thread.
    pub fn whole<T: PromptTokenizer + ?Sized>(
        tokenizer: Arc<T>,
        api: ApiKind,
        body: serde_json::Value,
    ) -> Self {
        Tokenizing::Rest(Box::new(move || tokenizer.tokenize(api, &body)))
    }
}

impl std::fmt::Debug for Tokenizing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tokenizing::Done(result) => f.debug_tuple("Done").field(result).finish(),
            Tokenizing::Rest(_) => f.write_str("Rest(..)"),
        }
    }
}

/// Turns an OpenAI request body into the prompt's token ids, exactly as the worker will.
///
/// [`PromptTokenizer::tokenize`] is called from blocking threads, several at once.
pub trait PromptTokenizer: Send + Sync + 'static {
    /// Tokenizes the prompt of `body` (a chat or completions request).
    ///
    /// # Errors
    /// [`TokenizeFailure::InvalidRequest`] for a body the API does not accept;
    /// [`TokenizeFailure::Internal`] when tokenization itself fails.
    fn tokenize(&self, api: ApiKind, body: &serde_json::Value)
        -> Result<Vec<u32>, TokenizeFailure>;

    /// Does on the calling thread (an async task's) what is cheap: with a cache, the body's
    /// checks, template and cache lookups, and the encoding itself when at most
    /// `inline_bytes` of text are left uncached. Anything more is returned as
    /// [`Tokenizing::Rest`] for a blocking thread. The default leaves everything to it.
    fn tokenize_here(
        self: Arc<Self>,
        api: ApiKind,
        body: serde_json::Value,
        inline_bytes: usize,
    ) -> Tokenizing {
        let _ = inline_bytes;
        Tokenizing::whole(self, api, body)
    }

    /// The token counts of a completions batch's prompts after the first (which
    /// [`PromptTokenizer::tokenize`] already counted), in order. The default knows no
    /// batches: the whole body was that one prompt.
    ///
    /// # Errors
    /// As [`PromptTokenizer::tokenize`].
    fn later_completion_prompt_lengths(
        &self,
        _body: &serde_json::Value,
    ) -> Result<Vec<usize>, TokenizeFailure> {
        Ok(Vec::new())
    }

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
#[error("cannot load the tokenizer from {dir} ({named_by}): {message}")]
pub struct TokenizerLoadError {
    /// The directory tried.
    pub dir: String,
    /// What named it (a flag, or the pool file's model).
    pub named_by: String,
    /// What went wrong.
    pub message: String,
}

/// Loads the model's tokenizer and chat template from `dir`, which `named_by` named (said in
/// the error).
///
/// # Errors
/// [`TokenizerLoadError`] when the files are missing or invalid.
pub fn load_model_tokenizer(
    dir: &Path,
    named_by: &str,
) -> Result<std::sync::Arc<dyn PromptTokenizer>, TokenizerLoadError> {
    match ModelTokenizer::from_dir(dir) {
        Ok(t) => Ok(std::sync::Arc::new(t)),
        Err(e) => Err(TokenizerLoadError {
            dir: dir.display().to_string(),
            named_by: named_by.to_owned(),
            message: e.to_string(),
        }),
    }
}

/// What names the control plane's default model folder, with how to fix it.
pub const DEFAULT_MODEL_DIR_NAMED_BY: &str =
    "--model-dir / SWITCHYARD_MODEL_DIR; scripts/setup.sh puts the default one in place";

impl From<TokenizeError> for TokenizeFailure {
    fn from(e: TokenizeError) -> Self {
        match e {
            TokenizeError::InvalidRequest { field, message } => {
                TokenizeFailure::InvalidRequest { field, message }
            }
            other => TokenizeFailure::Internal(other.to_string()),
        }
    }
}

impl PromptTokenizer for ModelTokenizer {
    fn tokenize(
        &self,
        api: ApiKind,
        body: &serde_json::Value,
    ) -> Result<Vec<u32>, TokenizeFailure> {
        self.tokenize_request(api, body)
            .map_err(TokenizeFailure::from)
    }

    fn tokenize_here(
        self: Arc<Self>,
        api: ApiKind,
        body: serde_json::Value,
        inline_bytes: usize,
    ) -> Tokenizing {
        let planned = match self.plan_request(api, &body) {
            Ok(planned) => planned,
            Err(e) => return Tokenizing::Done(Err(e.into())),
        };
        if planned.missing_bytes() <= inline_bytes {
            return Tokenizing::Done(self.finish(planned).map_err(TokenizeFailure::from));
        }
        let planned = planned.into_owned();
        Tokenizing::Rest(Box::new(move || {
            self.finish(planned).map_err(TokenizeFailure::from)
        }))
    }

    fn context_length(&self) -> Option<u32> {
        ModelTokenizer::context_length(self)
    }

    fn later_completion_prompt_lengths(
        &self,
        body: &serde_json::Value,
    ) -> Result<Vec<usize>, TokenizeFailure> {
        ModelTokenizer::later_completion_prompt_lengths(self, body).map_err(TokenizeFailure::from)
    }

    fn cache_stats(&self) -> SegmentCacheStats {
        let stats = ModelTokenizer::cache_stats(self);
        SegmentCacheStats {
            hits: stats.hits,
            misses: stats.misses,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_protocol::tokenize::default_model_dir;

    fn done(step: Tokenizing) -> Option<Vec<u32>> {
        match step {
            Tokenizing::Done(ids) => Some(ids.unwrap()),
            Tokenizing::Rest(_) => None,
        }
    }

    #[test]
    fn a_warm_prompt_is_finished_here_and_a_cold_one_left_for_a_blocking_thread() {
        let tok = load_model_tokenizer(&default_model_dir(), DEFAULT_MODEL_DIR_NAMED_BY).unwrap();
        let long = "the router keeps each session near its cache ".repeat(200);
        let body = serde_json::json!({"messages": [{"role": "user", "content": long}]});
        let inline = 2 << 10;
        let rest = match Arc::clone(&tok).tokenize_here(ApiKind::Chat, body.clone(), inline) {
            Tokenizing::Rest(rest) => rest,
            Tokenizing::Done(_) => panic!("9 KB of uncached text was encoded inline"),
        };
        let ids = rest().unwrap();
        assert_eq!(ids, tok.tokenize(ApiKind::Chat, &body).unwrap());
        // Cached now: finished here, to the same ids.
        let again = Arc::clone(&tok).tokenize_here(ApiKind::Chat, body.clone(), inline);
        assert_eq!(done(again), Some(ids));
        // A bad body is answered here, with the field.
        let bad = serde_json::json!({"messages": [{"role": 1}]});
        match Arc::clone(&tok).tokenize_here(ApiKind::Chat, bad, inline) {
            Tokenizing::Done(Err(TokenizeFailure::InvalidRequest { field, .. })) => {
                assert_eq!(field, "messages[0].role");
            }
            other => panic!("{other:?}"),
        }
    }
}
