//! The tokenizer bundle: a model's tokenization files as the control plane serves them to a
//! filter that tokenizes prompts itself (`GET` [`crate::route_input::TOKENIZER_PATH`]).

use serde::{Deserialize, Serialize};

use super::TokenizerFiles;

/// One model's tokenizer, chat template and the block size its prompts are hashed at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenizerBundle {
    /// Protocol version.
    #[serde(default = "crate::default_version")]
    pub v: u32,
    /// The model the control plane resolved the request to (`None`: the single model of a
    /// gateway that declares none).
    #[serde(default)]
    pub model: Option<String>,
    /// The block size the control plane matches this model's prompts at: the filter hashes
    /// at it ([`crate::route_input::HashedPrompt::block_size`]).
    pub block_size: u32,
    /// The files' texts.
    pub files: TokenizerFiles,
}
