//! The models behind the gateway: which one a route request's `model` names, with the
//! tokenizer and context length it is tokenized and checked with.
//!
//! Without a pool file, or with one that declares no model, the gateway serves one model, as
//! it always did: every request is tokenized with `--model-dir`'s tokenizer and routed among
//! every worker, whatever `model` it names (vLLM answers a name it does not serve itself).
//!
//! Once the pool file declares models, those are the models served: a request's `model` must
//! name one (any other name is answered 404 `model_not_found` by the gateway, never sent to
//! some other model's worker); it is tokenized with that model's `model_dir` (default
//! `--model-dir`) and routed among that model's workers only — declared ones and
//! self-registering (NATS) workers whose heartbeat carries the same `model`. A request
//! without `model` goes to the only model when one is declared (as vLLM serves its only
//! model), and is refused when several are.
//!
//! Declared models follow the pool file: on a reload, new models' tokenizers are loaded
//! before the new pools apply, and a tokenizer that does not load keeps the last good pools
//! (counted as a failed reload).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use serde_json::{Map, Value};

use crate::pools::file::Pools;
use crate::service::tokenizer::{
    load_model_tokenizer, PromptTokenizer, SegmentCacheStats, TokenizerLoadError,
};

/// Context length assumed when neither `--max-model-len` nor the model folder gives one.
pub const DEFAULT_MAX_MODEL_LEN: u32 = 131_072;

/// The block size a filter that tokenizes itself hashes a model's prompts at when no worker of
/// it is live and the pool file declares none: vLLM's default.
pub const DEFAULT_BLOCK_SIZE: u32 = 16;

/// One model as the route API uses it.
pub struct ServedModel {
    /// The declared name; `None` for the single model of a gateway without declared models
    /// (whose requests are routed among every worker).
    pub name: Option<String>,
    /// Where its tokenizer came from (to keep it across reloads that do not change it).
    pub dir: PathBuf,
    /// Its tokenizer and chat template.
    pub tokenizer: Arc<dyn PromptTokenizer>,
    /// Its context length: longer prompts and larger `max_tokens` are refused.
    pub max_model_len: u32,
    /// The block size a filter that tokenizes itself hashes its prompts at (the tokenizer
    /// bundle's) when none of its workers is live: its first declared worker's, else
    /// [`DEFAULT_BLOCK_SIZE`].
    pub block_size: u32,
    /// Its disaggregated legs carry a `disagg_request_id` (the pool file's
    /// `trtllm_disagg_request_id`).
    pub disagg_request_id: bool,
}

impl std::fmt::Debug for ServedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServedModel")
            .field("name", &self.name)
            .field("dir", &self.dir)
            .field("max_model_len", &self.max_model_len)
            .finish_non_exhaustive()
    }
}

/// Why a route request names no model this gateway serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelRefusal {
    /// A name no declared model has: 404 `model_not_found`.
    Unknown(String),
    /// `model` is not a string (vLLM's request models refuse it: 400), whatever is served.
    NotAString,
    /// No `model`, and several models are declared: 400.
    Missing,
}

/// The served models (see the module docs).
#[derive(Debug)]
pub struct Models {
    /// `--model-dir`'s model: the only one without declared models, and the tokenizer of
    /// every declared model that names no `model_dir`.
    default: Arc<ServedModel>,
    /// `--max-model-len`, which wins over every model folder's own context length.
    max_model_len: Option<u32>,
    /// Declared models by name; empty without a pool file.
    declared: RwLock<BTreeMap<String, Arc<ServedModel>>>,
}

/// A model's context length: `--max-model-len`, else its folder's, else the default.
fn context_length(flag: Option<u32>, tokenizer: &dyn PromptTokenizer) -> u32 {
    flag.or(tokenizer.context_length())
        .unwrap_or(DEFAULT_MAX_MODEL_LEN)
}

impl Models {
    /// One model: `tokenizer` (loaded from `dir`), no declared models yet.
    pub fn single(dir: PathBuf, tokenizer: Arc<dyn PromptTokenizer>, flag: Option<u32>) -> Self {
        Models {
            default: Arc::new(ServedModel {
                name: None,
                dir,
                max_model_len: context_length(flag, tokenizer.as_ref()),
                tokenizer,
                block_size: DEFAULT_BLOCK_SIZE,
                disagg_request_id: false,
            }),
            max_model_len: flag,
            declared: RwLock::new(BTreeMap::new()),
        }
    }

    /// The `--model-dir` model.
    pub fn default_model(&self) -> &Arc<ServedModel> {
        &self.default
    }

    /// Declared model names, sorted (the `model` label's values).
    pub fn names(&self) -> Vec<String> {
        self.read().keys().cloned().collect()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Arc<ServedModel>>> {
        // A poisoned lock only means a writer panicked mid-insert of a whole map; the map
        // itself is always a complete one.
        self.declared.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The model a request body names (see the module docs).
    ///
    /// # Errors
    /// [`ModelRefusal`] when it names none this gateway serves.
    pub fn resolve(&self, body: &Map<String, Value>) -> Result<Arc<ServedModel>, ModelRefusal> {
        if body
            .get("model")
            .is_some_and(|m| !m.is_null() && !m.is_string())
        {
            return Err(ModelRefusal::NotAString);
        }
        let declared = self.read();
        if declared.is_empty() {
            return Ok(Arc::clone(&self.default));
        }
        match body.get("model") {
            None | Some(Value::Null) if declared.len() == 1 => Ok(declared
                .values()
                .next()
                .map(Arc::clone)
                .unwrap_or_else(|| Arc::clone(&self.default))),
            None | Some(Value::Null) => Err(ModelRefusal::Missing),
            Some(Value::String(name)) => declared
                .get(name)
                .map(Arc::clone)
                .ok_or_else(|| ModelRefusal::Unknown(name.clone())),
            Some(_) => Err(ModelRefusal::NotAString),
        }
    }

    /// The declared models of `pools` with their tokenizers: kept from the current ones when
    /// name and folder are unchanged, `--model-dir`'s when a model names no folder, loaded
    /// otherwise. Blocking (reads tokenizer files): call it off the async threads.
    ///
    /// # Errors
    /// [`TokenizerLoadError`] for the first tokenizer that does not load.
    pub fn load_declared(
        &self,
        pools: &Pools,
    ) -> Result<BTreeMap<String, Arc<ServedModel>>, TokenizerLoadError> {
        let current = self.read().clone();
        let mut next = BTreeMap::new();
        for name in &pools.models {
            let dir = pools.model_dirs.get(name).map(PathBuf::as_path);
            let dir = dir.unwrap_or(self.default.dir.as_path());
            let kept = current.get(name).filter(|m| m.dir == dir);
            let tokenizer = match kept {
                Some(m) => Arc::clone(&m.tokenizer),
                None if dir == self.default.dir => Arc::clone(&self.default.tokenizer),
                None => load_model_tokenizer(
                    dir,
                    &format!("the pool file's model_dir of model `{name}`"),
                )?,
            };
            next.insert(
                name.clone(),
                Arc::new(ServedModel {
                    name: Some(name.clone()),
                    dir: dir.to_owned(),
                    max_model_len: context_length(self.max_model_len, tokenizer.as_ref()),
                    tokenizer,
                    block_size: pools
                        .workers
                        .values()
                        .find(|w| &w.model == name)
                        .map_or(DEFAULT_BLOCK_SIZE, |w| w.block_size.get()),
                    disagg_request_id: pools.disagg_request_id_models.contains(name),
                }),
            );
        }
        Ok(next)
    }

    /// Serves `declared` from now on.
    pub fn install(&self, declared: BTreeMap<String, Arc<ServedModel>>) {
        let mut map = self.declared.write().unwrap_or_else(|e| e.into_inner());
        *map = declared;
    }

    /// The tokenizers' segment-cache counters, each tokenizer counted once.
    pub fn cache_stats(&self) -> SegmentCacheStats {
        let declared = self.read();
        let mut seen: Vec<*const ()> = Vec::new();
        let mut total = SegmentCacheStats::default();
        for t in
            std::iter::once(&self.default.tokenizer).chain(declared.values().map(|m| &m.tokenizer))
        {
            let ptr = Arc::as_ptr(t).cast::<()>();
            if !seen.contains(&ptr) {
                seen.push(ptr);
                let s = t.cache_stats();
                total.hits += s.hits;
                total.misses += s.misses;
            }
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use switchyard_protocol::route::ApiKind;

    use std::path::Path;

    use super::*;
    use crate::service::tokenizer::TokenizeFailure;

    struct Fixed(u32);

    impl PromptTokenizer for Fixed {
        fn tokenize(&self, _: ApiKind, _: &Value) -> Result<Vec<u32>, TokenizeFailure> {
            Ok(vec![self.0])
        }
        fn context_length(&self) -> Option<u32> {
            Some(1_000 + self.0)
        }
    }

    fn pools(text: &str) -> Pools {
        Pools::parse(text, Path::new("pools.yaml")).unwrap()
    }

    fn body(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    fn name(m: &ServedModel) -> Option<&str> {
        m.name.as_deref()
    }

    #[test]
    fn without_declared_models_every_request_is_the_default_model() {
        let models = Models::single("/m".into(), Arc::new(Fixed(1)), None);
        for b in [
            json!({}),
            json!({"model": "anything"}),
            json!({"model": null}),
        ] {
            let m = models.resolve(&body(b)).unwrap();
            assert_eq!(name(&m), None);
            assert_eq!(m.max_model_len, 1_001);
        }
        // Not a name at all: the engine would refuse it, so the gateway does.
        assert_eq!(
            models.resolve(&body(json!({"model": 3}))).unwrap_err(),
            ModelRefusal::NotAString
        );
        assert!(models.names().is_empty());
    }

    #[test]
    fn declared_models_are_the_only_ones_served() {
        let models = Models::single("/m".into(), Arc::new(Fixed(1)), Some(512));
        let two =
            pools("models:\n  - { name: a, block_size: 16 }\n  - { name: b, block_size: 16 }\n");
        models.install(models.load_declared(&two).unwrap());
        assert_eq!(models.names(), ["a", "b"]);
        let a = models.resolve(&body(json!({"model": "a"}))).unwrap();
        assert_eq!(name(&a), Some("a"));
        assert_eq!(a.max_model_len, 512, "--max-model-len wins");
        assert!(
            Arc::ptr_eq(&a.tokenizer, &models.default_model().tokenizer),
            "no model_dir: --model-dir's"
        );
        assert_eq!(
            models.resolve(&body(json!({"model": "c"}))).unwrap_err(),
            ModelRefusal::Unknown("c".into())
        );
        assert_eq!(
            models.resolve(&body(json!({"model": ["a"]}))).unwrap_err(),
            ModelRefusal::NotAString
        );
        assert_eq!(
            models.resolve(&body(json!({}))).unwrap_err(),
            ModelRefusal::Missing
        );
        let one = pools("models:\n  - { name: a, block_size: 16 }\n");
        models.install(models.load_declared(&one).unwrap());
        assert_eq!(
            name(&models.resolve(&body(json!({}))).unwrap()),
            Some("a"),
            "the only model"
        );
        // A type error whatever is served, as vLLM's request models have it.
        let single = Models::single("/m".into(), Arc::new(Fixed(1)), None);
        assert_eq!(
            single.resolve(&body(json!({"model": 5}))).unwrap_err(),
            ModelRefusal::NotAString
        );
        assert!(single.resolve(&body(json!({"model": "anything"}))).is_ok());
    }

    #[test]
    fn a_model_dir_that_does_not_load_is_an_error_naming_it() {
        let models = Models::single("/m".into(), Arc::new(Fixed(1)), None);
        let p = pools(
            "models:\n  - { name: a, block_size: 16, model_dir: /nonexistent/switchyard-model }\n",
        );
        assert_eq!(
            p.model_dirs["a"],
            Path::new("/nonexistent/switchyard-model")
        );
        let err = models.load_declared(&p).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/switchyard-model")
                && err
                    .to_string()
                    .contains("pool file's model_dir of model `a`")
                && !err.to_string().contains("scripts/setup.sh"),
            "{err}"
        );
    }
}
