//! Tokenizing in the filter (config `"tokenize": "filter"`): the per-VM tokenizers, how they
//! are fetched, and a body turned into the compact route input.
//!
//! Each VM (one per Envoy worker thread) loads a model's tokenizer once, from the bundle the
//! control plane serves (`GET /v1/tokenizer`), the first time a request names that model; the
//! root context's timer sends the fetch and retries a failed one with backoff. Until the
//! tokenizer is there, and for any body it cannot tokenize, the route call carries the body as
//! in `control_plane` mode: the control plane answers it exactly as before (a malformed
//! body's 400 included), so there is one validation path and no request fails for this mode.
//!
//! The tokenizer is `switchyard_protocol::tokenize::ModelTokenizer`, the control plane's own,
//! so the ids (and block hashes) are the ones the control plane would compute. Plain Rust, no
//! hostcalls: native tests cover it.

use std::collections::HashMap;
use std::path::Path;
use std::rc::Rc;

use serde_json::Value;
use switchyard_protocol::hash::BlockSize;
use switchyard_protocol::route::{is_header_safe_model, ApiKind};
use switchyard_protocol::route_input::HashedPrompt;
use switchyard_protocol::tokenize::{
    ModelTokenizer, TokenizeError, TokenizerBundle, DEFAULT_CACHE_BYTES,
};

/// Most models a VM keeps a tokenizer slot for. Request bodies name the model, so without a
/// bound a client could make a VM remember (and fetch) any number of names.
pub const MAX_MODELS: usize = 16;
/// First retry of a failed fetch; each failure doubles it up to [`MAX_RETRY_MS`].
pub const FIRST_RETRY_MS: u64 = 1_000;
/// Longest wait between fetches of a tokenizer that failed.
pub const MAX_RETRY_MS: u64 = 60_000;

/// The model a body names, as the key of its tokenizer: `None` for a body without `model`
/// (the control plane then resolves its only model).
pub type ModelKey = Option<String>;

/// Why a routed request's route call carries the body instead of block hashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFallback {
    /// No tokenizer for its model yet (being fetched, failed, or more models than
    /// [`MAX_MODELS`]).
    NotLoaded,
    /// The tokenizer refused the body (the client's mistake: the control plane answers it).
    InvalidRequest,
    /// The tokenizer or the template failed on it.
    TokenizerError,
    /// The request asks the engine to cut its prompt (`truncate_prompt_tokens`): the cut
    /// depends on the model's context, which the control plane knows.
    Truncated,
}

impl BodyFallback {
    /// Every reason, in stat order.
    pub const ALL: [BodyFallback; 4] = [
        BodyFallback::NotLoaded,
        BodyFallback::InvalidRequest,
        BodyFallback::TokenizerError,
        BodyFallback::Truncated,
    ];

    /// Stat key.
    pub fn as_str(self) -> &'static str {
        match self {
            BodyFallback::NotLoaded => "not_loaded",
            BodyFallback::InvalidRequest => "invalid_request",
            BodyFallback::TokenizerError => "tokenizer_error",
            BodyFallback::Truncated => "truncated",
        }
    }
}

/// A model's tokenizer loaded in this VM and the block size to hash at.
pub struct LoadedTokenizer {
    tokenizer: ModelTokenizer,
    block_size: BlockSize,
}

impl std::fmt::Debug for LoadedTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedTokenizer")
            .field("block_size", &self.block_size.get())
            .finish_non_exhaustive()
    }
}

/// Why a fetched bundle did not give a tokenizer.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The control plane did not answer 200 (404: a model it does not serve).
    #[error("the control plane answered {0}")]
    Status(String),
    /// The answer is not a bundle.
    #[error("not a tokenizer bundle: {0}")]
    Bundle(String),
    /// The bundle's block size is 0 or too large.
    #[error("block size {0} out of range")]
    BlockSize(u32),
    /// The files do not make a tokenizer.
    #[error(transparent)]
    Tokenizer(#[from] TokenizeError),
}

impl LoadedTokenizer {
    /// Builds the tokenizer from a bundle's JSON (the control plane's answer).
    ///
    /// # Errors
    /// [`LoadError`] saying what is wrong with it.
    pub fn from_bundle_json(json: &[u8]) -> Result<Self, LoadError> {
        let bundle: TokenizerBundle =
            serde_json::from_slice(json).map_err(|e| LoadError::Bundle(e.to_string()))?;
        let block_size = BlockSize::try_new(bundle.block_size)
            .map_err(|_| LoadError::BlockSize(bundle.block_size))?;
        let origin =
            Path::new("tokenizer-bundle").join(bundle.model.as_deref().unwrap_or("default"));
        let tokenizer = ModelTokenizer::from_files(&bundle.files, &origin, DEFAULT_CACHE_BYTES)?;
        Ok(LoadedTokenizer {
            tokenizer,
            block_size,
        })
    }

    /// The compact route input of a request body: its prompt tokenized as the control plane
    /// would, hashed at the bundle's block size, with the body's non-prompt fields.
    ///
    /// # Errors
    /// The [`BodyFallback`] that sends the body instead.
    pub fn hashed_prompt(&self, api: ApiKind, body: &Value) -> Result<HashedPrompt, BodyFallback> {
        let Some(object) = body.as_object() else {
            return Err(BodyFallback::InvalidRequest);
        };
        if object
            .get("truncate_prompt_tokens")
            .is_some_and(|v| !v.is_null())
        {
            return Err(BodyFallback::Truncated);
        }
        let tokens = self
            .tokenizer
            .tokenize_request(api, body)
            .map_err(|e| match e {
                TokenizeError::InvalidRequest { .. } => BodyFallback::InvalidRequest,
                _ => BodyFallback::TokenizerError,
            })?;
        Ok(HashedPrompt::of(&tokens, self.block_size, object))
    }
}

/// Where one model's tokenizer is.
#[derive(Debug)]
enum Slot {
    /// A request wanted it; the next tick fetches it.
    Wanted,
    /// The fetch is in flight; `failures` before it (the backoff grows with them).
    Fetching { failures: u32 },
    /// Ready.
    Loaded(Rc<LoadedTokenizer>),
    /// The last fetch failed; fetch again from `retry_at_ms`.
    Failed { failures: u32, retry_at_ms: u64 },
}

/// The tokenizers of one VM, by model.
#[derive(Debug, Default)]
pub struct Tokenizers {
    slots: HashMap<ModelKey, Slot>,
}

impl Tokenizers {
    /// The tokenizer of `model` if loaded; otherwise notes that a request wants it (the
    /// root's next tick fetches it) and returns `None`.
    pub fn get_or_want(&mut self, model: &ModelKey) -> Option<Rc<LoadedTokenizer>> {
        if let Some(slot) = self.slots.get(model) {
            return match slot {
                Slot::Loaded(loaded) => Some(Rc::clone(loaded)),
                _ => None,
            };
        }
        if self.slots.len() < MAX_MODELS {
            self.slots.insert(model.clone(), Slot::Wanted);
        }
        None
    }

    /// The models to fetch now (wanted, or failed and due at `now_ms`), marked in flight.
    pub fn due(&mut self, now_ms: u64) -> Vec<ModelKey> {
        let mut due = Vec::new();
        for (model, slot) in &mut self.slots {
            let failures = match slot {
                Slot::Wanted => 0,
                Slot::Failed {
                    failures,
                    retry_at_ms,
                } if now_ms >= *retry_at_ms => *failures,
                Slot::Failed { .. } | Slot::Fetching { .. } | Slot::Loaded(_) => continue,
            };
            *slot = Slot::Fetching { failures };
            due.push(model.clone());
        }
        due
    }

    /// The fetch of `model` ended with `result` at `now_ms`: keep the tokenizer, or schedule
    /// a retry (returned: when, for the log).
    pub fn finish(
        &mut self,
        model: &ModelKey,
        result: Result<LoadedTokenizer, LoadError>,
        now_ms: u64,
    ) -> Option<u64> {
        let failures = match self.slots.get(model) {
            Some(Slot::Fetching { failures } | Slot::Failed { failures, .. }) => *failures,
            _ => 0,
        };
        match result {
            Ok(loaded) => {
                self.slots
                    .insert(model.clone(), Slot::Loaded(Rc::new(loaded)));
                None
            }
            Err(_) => {
                let failures = failures.saturating_add(1);
                let wait = FIRST_RETRY_MS
                    .saturating_mul(1 << failures.min(16).saturating_sub(1))
                    .min(MAX_RETRY_MS);
                let retry_at_ms = now_ms.saturating_add(wait);
                self.slots.insert(
                    model.clone(),
                    Slot::Failed {
                        failures,
                        retry_at_ms,
                    },
                );
                Some(retry_at_ms)
            }
        }
    }
}

/// The model a parsed body names, as a tokenizer key: `Ok(None)` without `model`. A `model`
/// that is not a string is `InvalidRequest` (the control plane refuses it); one that cannot be
/// a header value (the bundle fetch names it in `x-switchyard-model`) is `NotLoaded`: no
/// tokenizer is ever fetched for it, and the control plane answers its body.
pub fn model_key(body: &Value) -> Result<ModelKey, BodyFallback> {
    match body.get("model") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(name)) if is_header_safe_model(name) => Ok(Some(name.clone())),
        Some(Value::String(_)) => Err(BodyFallback::NotLoaded),
        Some(_) => Err(BodyFallback::InvalidRequest),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wanted_model_is_fetched_once_and_retried_with_backoff() {
        let mut t = Tokenizers::default();
        let m: ModelKey = Some("m".into());
        assert!(t.get_or_want(&m).is_none());
        assert!(t.get_or_want(&m).is_none());
        assert_eq!(t.due(0), vec![m.clone()]);
        assert!(t.due(0).is_empty(), "in flight: not fetched twice");
        let failed = || Err(LoadError::Status("404".into()));
        assert_eq!(t.finish(&m, failed(), 10), Some(10 + FIRST_RETRY_MS));
        assert!(t.due(10 + FIRST_RETRY_MS - 1).is_empty());
        assert_eq!(t.due(10 + FIRST_RETRY_MS), vec![m.clone()]);
        assert_eq!(
            t.finish(&m, failed(), 2_000),
            Some(2_000 + 2 * FIRST_RETRY_MS)
        );
        for _ in 0..20 {
            t.due(u64::MAX);
            t.finish(&m, failed(), 0);
        }
        assert!(t.due(MAX_RETRY_MS - 1).is_empty());
        assert_eq!(t.due(MAX_RETRY_MS), vec![m]);
    }

    #[test]
    fn the_number_of_models_is_bounded() {
        let mut t = Tokenizers::default();
        for i in 0..MAX_MODELS + 10 {
            assert!(t.get_or_want(&Some(format!("m{i}"))).is_none());
        }
        assert_eq!(t.due(0).len(), MAX_MODELS);
    }

    #[test]
    fn model_keys() {
        let key = |s: &str| model_key(&serde_json::from_str(s).unwrap());
        assert_eq!(key(r#"{"model":"a"}"#), Ok(Some("a".into())));
        assert_eq!(key(r#"{"model":null}"#), Ok(None));
        assert_eq!(key(r#"{}"#), Ok(None));
        assert_eq!(key(r#"{"model":1}"#), Err(BodyFallback::InvalidRequest));
        assert_eq!(key(r#"{"model":"a\nb"}"#), Err(BodyFallback::NotLoaded));
    }

    #[test]
    fn a_bad_bundle_is_a_named_error() {
        let err = LoadedTokenizer::from_bundle_json(b"{}").unwrap_err();
        assert!(matches!(err, LoadError::Bundle(_)), "{err}");
        let err = LoadedTokenizer::from_bundle_json(
            br#"{"block_size":0,"files":{"tokenizer_json":"{}"}}"#,
        )
        .unwrap_err();
        assert!(matches!(err, LoadError::BlockSize(0)), "{err}");
        let err = LoadedTokenizer::from_bundle_json(
            br#"{"block_size":16,"files":{"tokenizer_json":"{}"}}"#,
        )
        .unwrap_err();
        assert!(matches!(err, LoadError::Tokenizer(_)), "{err}");
    }
}
