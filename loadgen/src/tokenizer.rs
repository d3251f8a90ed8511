//! The two things the load generator needs from a tokenizer, as a trait.
//!
//! Prompt synthesis needs to know which words are single tokens and what the chat template
//! adds around a message; nothing else. Keeping that behind a small trait lets the pure parts
//! be tested with a stand-in and keeps the workload independent of how the real tokenizer
//! (`switchyard_protocol::tokenize::ModelTokenizer`) is built.

use serde_json::Value;
use switchyard_protocol::route::ApiKind;

/// Text and request tokenization, errors as text (the load generator only reports them).
pub trait TextTokenizer {
    /// Token ids of `text`, exactly as the serving engine would encode a raw prompt.
    ///
    /// # Errors
    /// The tokenizer's error message.
    fn encode_text(&self, text: &str) -> Result<Vec<u32>, String>;

    /// Token ids of a whole OpenAI request body: the chat template rendered for `chat`, the
    /// `prompt` for `completions`, exactly as the serving engine (and Switchyard's control
    /// plane) tokenizes it.
    ///
    /// # Errors
    /// The tokenizer's error message.
    fn tokenize_body(&self, api: ApiKind, body: &Value) -> Result<Vec<u32>, String>;
}

impl TextTokenizer for switchyard_protocol::tokenize::ModelTokenizer {
    fn encode_text(&self, text: &str) -> Result<Vec<u32>, String> {
        self.encode(text).map_err(|e| e.to_string())
    }

    fn tokenize_body(&self, api: ApiKind, body: &Value) -> Result<Vec<u32>, String> {
        self.tokenize_request(api, body).map_err(|e| e.to_string())
    }
}
