//! Reading a Hugging Face model folder: `tokenizer.json`, `tokenizer_config.json` and the chat
//! template (in the config, as a list of named templates, or in `chat_template.jinja`).

use std::path::{Path, PathBuf};

use serde_json::Value as Json;
use tokenizers::Tokenizer;

use super::error::TokenizeError;

/// Special-token names transformers passes to every chat template (its `special_tokens_map`).
const SPECIAL_TOKEN_NAMES: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// What a model folder provides for tokenization.
pub(crate) struct ModelFiles {
    /// The HF tokenizer, with truncation and padding off (transformers' call defaults).
    pub tokenizer: Tokenizer,
    /// The chat template; `None` for models without one (completions only).
    pub chat_template: Option<String>,
    /// The template transformers picks instead when the request has `tools`, if the model names
    /// one `tool_use`.
    pub tool_use_template: Option<String>,
    /// `bos_token`, `eos_token`, ... as set in the config.
    pub special_tokens: Vec<(&'static str, String)>,
    /// The model's context length, if the folder says (see [`context_length`]).
    pub context_length: Option<u32>,
    /// The largest token id a prompt may hold (see [`max_token_id`]).
    pub max_token_id: u32,
}

/// The texts of a model folder's tokenization files: what [`load`] reads from disk, and what
/// the control plane sends a filter that tokenizes itself ([`super::TokenizerBundle`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TokenizerFiles {
    /// `tokenizer.json`.
    pub tokenizer_json: String,
    /// `tokenizer_config.json`, if the folder has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer_config_json: Option<String>,
    /// `chat_template.jinja`, if the folder has one (it wins over the config's template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template_jinja: Option<String>,
    /// `config.json` (the model's; its context length), if the folder has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_json: Option<String>,
}

impl TokenizerFiles {
    /// Reads the files of `dir`.
    ///
    /// # Errors
    /// [`TokenizeError::ModelDir`] naming the file that is missing or unreadable.
    pub fn read_dir(dir: &Path) -> Result<Self, TokenizeError> {
        let dir_err = |path: PathBuf, message: String| TokenizeError::ModelDir { path, message };
        if !dir.is_dir() {
            return Err(dir_err(
                dir.to_path_buf(),
                // Where the folder was named, and how to fix it, is the caller's to say.
                "not a directory".into(),
            ));
        }
        let optional = |name: &str| -> Result<Option<String>, TokenizeError> {
            let path = dir.join(name);
            if !path.exists() {
                return Ok(None);
            }
            std::fs::read_to_string(&path)
                .map(Some)
                .map_err(|e| dir_err(path, e.to_string()))
        };
        let tokenizer_path = dir.join("tokenizer.json");
        Ok(TokenizerFiles {
            tokenizer_json: std::fs::read_to_string(&tokenizer_path)
                .map_err(|e| dir_err(tokenizer_path, e.to_string()))?,
            tokenizer_config_json: optional("tokenizer_config.json")?,
            chat_template_jinja: optional("chat_template.jinja")?,
            // An unreadable model config only loses the context length, as before.
            config_json: optional("config.json").ok().flatten(),
        })
    }
}

/// Loads the folder.
///
/// # Errors
/// [`TokenizeError::ModelDir`] naming the file that is missing or malformed.
pub(crate) fn load(dir: &Path) -> Result<ModelFiles, TokenizeError> {
    parse(&TokenizerFiles::read_dir(dir)?, dir)
}

/// Builds what tokenization needs from the files' texts; errors name the file under `dir`
/// (where the texts came from: a folder, or a bundle's model name).
///
/// # Errors
/// [`TokenizeError::ModelDir`] naming the file that is malformed.
pub(crate) fn parse(files: &TokenizerFiles, dir: &Path) -> Result<ModelFiles, TokenizeError> {
    let dir_err = |path: PathBuf, message: String| TokenizeError::ModelDir { path, message };
    let tokenizer_path = dir.join("tokenizer.json");
    let mut tokenizer: Tokenizer = files
        .tokenizer_json
        .parse()
        .map_err(|e: tokenizers::Error| dir_err(tokenizer_path.clone(), e.to_string()))?;
    tokenizer
        .with_truncation(None)
        .map_err(|e| dir_err(tokenizer_path.clone(), e.to_string()))?;
    tokenizer.with_padding(None);

    let config_path = dir.join("tokenizer_config.json");
    let config: Json = match &files.tokenizer_config_json {
        Some(text) => serde_json::from_str(text)
            .map_err(|e| dir_err(config_path.clone(), format!("invalid JSON: {e}")))?,
        None => Json::Object(Default::default()),
    };

    let special_tokens = SPECIAL_TOKEN_NAMES
        .iter()
        .filter_map(|name| token_content(config.get(*name)?).map(|t| (*name, t)))
        .collect();

    let (mut chat_template, tool_use_template) = match config.get("chat_template") {
        None | Some(Json::Null) => (None, None),
        Some(Json::String(t)) => (Some(t.clone()), None),
        Some(Json::Array(named)) => {
            let find = |wanted: &str| {
                named.iter().find_map(|t| {
                    (t.get("name")?.as_str()? == wanted)
                        .then(|| t.get("template")?.as_str().map(str::to_owned))?
                })
            };
            (find("default"), find("tool_use"))
        }
        Some(_) => {
            return Err(dir_err(
                config_path,
                "`chat_template` must be a string or a list of {name, template}".into(),
            ))
        }
    };
    // transformers saves templates to their own file nowadays; it wins over the config's.
    if let Some(jinja) = &files.chat_template_jinja {
        chat_template = Some(jinja.clone());
    }
    let model_config: Option<Json> = files
        .config_json
        .as_deref()
        .and_then(|text| serde_json::from_str(text).ok());
    Ok(ModelFiles {
        max_token_id: max_token_id(&tokenizer, model_config.as_ref()),
        tokenizer,
        chat_template,
        tool_use_template,
        special_tokens,
        context_length: context_length(model_config.as_ref(), &config),
    })
}

/// The largest token id vLLM takes in a prompt: the larger of the tokenizer's largest id
/// (added tokens included) and the model's `vocab_size` − 1 from `config.json` (Qwen3's
/// embedding table is padded beyond its tokenizer). Without `config.json` the tokenizer's
/// bound stands, which refuses only the padding ids no tokenizer produces.
fn max_token_id(tokenizer: &Tokenizer, model_config: Option<&Json>) -> u32 {
    let tokenizer_max = tokenizer
        .get_vocab(true)
        .values()
        .copied()
        .max()
        .unwrap_or(0);
    let model_max = model_config
        .and_then(|c| c.get("vocab_size")?.as_u64())
        .and_then(|n| u32::try_from(n.checked_sub(1)?).ok())
        .unwrap_or(0);
    tokenizer_max.max(model_max)
}

/// The context length vLLM would derive: the model config's `max_position_embeddings`, else
/// the tokenizer config's `model_max_length`. Transformers writes a huge sentinel
/// (about 1e30) for "no limit"; anything above `u32::MAX` counts as unknown.
fn context_length(model_config: Option<&Json>, tokenizer_config: &Json) -> Option<u32> {
    let read = |doc: &Json, key: &str| {
        doc.get(key)?
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| *n > 0)
    };
    model_config
        .and_then(|c| read(c, "max_position_embeddings"))
        .or_else(|| read(tokenizer_config, "model_max_length"))
}

/// A special token in the config: a string or an `AddedToken` object `{content: ...}`.
fn token_content(value: &Json) -> Option<String> {
    match value {
        Json::String(s) => Some(s.clone()),
        Json::Object(map) => map.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn special_tokens_may_be_strings_or_objects() {
        assert_eq!(token_content(&json!("<s>")).as_deref(), Some("<s>"));
        assert_eq!(
            token_content(&json!({"__type": "AddedToken", "content": "</s>", "lstrip": false}))
                .as_deref(),
            Some("</s>")
        );
        assert_eq!(token_content(&json!(null)), None);
    }

    #[test]
    fn the_context_length_comes_from_the_model_then_the_tokenizer_config() {
        let tokenizer = json!({"model_max_length": 131072});
        let model = json!({"max_position_embeddings": 40960});
        assert_eq!(context_length(Some(&model), &tokenizer), Some(40960));
        assert_eq!(context_length(None, &tokenizer), Some(131072));
        let sentinel = json!({"model_max_length": 1e30});
        assert_eq!(context_length(None, &sentinel), None);
        assert_eq!(context_length(Some(&json!({})), &json!({})), None);
    }

    #[test]
    fn a_missing_dir_is_named() {
        let err = load(Path::new("/nonexistent/model"))
            .err()
            .expect("must fail");
        // How to fix it is the caller's to say: a flag's default, a pool file's model.
        let text = err.to_string();
        assert!(
            text.contains("/nonexistent/model") && text.contains("not a directory"),
            "{err}"
        );
    }
}
