//! The OpenAI request fields a simulated worker acts on, and the response bodies it sends.
//!
//! Requests stay `serde_json::Value`s (key order preserved) because the tokenizer renders the
//! chat template from the body as the client sent it; only the fields that change what the
//! worker does are pulled out and validated here. Responses follow vLLM's shapes
//! (`chat.completion`, `chat.completion.chunk`, `text_completion`) so clients and the
//! Switchyard filter cannot tell a simulated worker from a real one. **The generated text is
//! filler**: no model runs, so every token is a word from [`FILLER_WORDS`].

use serde_json::{json, Map, Value};
use switchyard_protocol::handoff::{DISAGGREGATED_PARAMS, KV_TRANSFER_PARAMS};
use switchyard_protocol::openai::{generation_params, prompt_count, Truncation};
use switchyard_protocol::route::ApiKind;

use super::error::ApiError;
use super::legs::PrefillAnswer;

/// `max_tokens` when a request names none (vLLM would fill the context; a short default keeps
/// forgotten fields from tying a simulated worker up for minutes).
pub const DEFAULT_MAX_TOKENS: u32 = 16;

/// The words simulated tokens decode to, cycled.
pub const FILLER_WORDS: [&str; 8] = [
    " simulated",
    " token",
    " from",
    " a",
    " switchyard",
    " worker",
    " on",
    " GB200",
];

/// What the worker must do with a request, pulled out of its body.
#[derive(Debug, Clone)]
pub struct ParsedRequest {
    /// Endpoint it came in on.
    pub endpoint: ApiKind,
    /// The body as sent (for the tokenizer).
    pub body: Value,
    /// `model` as sent (echoed back; any name is accepted, see `docs/sim-worker.md`).
    pub model: Option<String>,
    /// Stream SSE chunks instead of one JSON body.
    pub stream: bool,
    /// `stream_options.include_usage`: end the stream with a usage chunk.
    pub include_usage: bool,
    /// Tokens to generate.
    pub max_tokens: u32,
    /// The prompt's tokens the engine keeps (`truncate_prompt_tokens`), as vLLM cuts them.
    pub truncation: Option<Truncation>,
    /// `cache_salt` (checked): the prompt's blocks are keyed by it.
    pub cache_salt: Option<String>,
    /// The request asks prompt logprobs: as in vLLM, it reads no cached KV and computes its
    /// whole prompt (the logprobs themselves are not simulated).
    pub prompt_logprobs: bool,
}

/// Token counts of a finished request (OpenAI `usage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Generated tokens.
    pub completion_tokens: u32,
    /// Prompt tokens whose KV was not computed here (prefix-cache hits, pulled KV).
    pub cached_tokens: u32,
}

impl Usage {
    /// The OpenAI `usage` object, with vLLM's `prompt_tokens_details.cached_tokens`.
    pub fn to_json(self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "completion_tokens": self.completion_tokens,
            "prompt_tokens_details": { "cached_tokens": self.cached_tokens },
        })
    }
}

/// Reads the fields the worker acts on and rejects what vLLM would reject (the checks the
/// control plane runs too, `switchyard_protocol::openai`), for a model of `max_model_len`
/// tokens. Only one choice (`n = 1`) is simulated.
///
/// # Errors
/// [`ApiError`] (400) naming the offending field.
pub fn parse_request(
    endpoint: ApiKind,
    body: Value,
    max_model_len: u32,
) -> Result<ParsedRequest, ApiError> {
    let obj = body
        .as_object()
        .ok_or_else(|| ApiError::bad_request("request body must be a JSON object", None))?;
    let model = match obj.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(m)) => Some(m.clone()),
        Some(_) => {
            return Err(ApiError::bad_request(
                "`model` must be a string",
                Some("model"),
            ))
        }
    };
    let params = generation_params(endpoint, obj, max_model_len).map_err(ApiError::from)?;
    if params.n != 1 {
        return Err(ApiError::bad_request(
            "only n = 1 is supported by the simulated worker",
            Some("n"),
        ));
    }
    // A completions batch is several requests in one body; the simulated engine serves one
    // prompt per request, and answering the first alone would drop the others silently.
    if prompt_count(endpoint, obj) != 1 {
        return Err(ApiError::bad_request(
            "only one prompt per request is supported by the simulated worker: send a batch's prompts as separate requests",
            Some("prompt"),
        ));
    }
    Ok(ParsedRequest {
        endpoint,
        model,
        stream: params.stream,
        include_usage: params.include_usage,
        max_tokens: params.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
        truncation: params.truncation,
        cache_salt: obj
            .get("cache_salt")
            .and_then(Value::as_str)
            .map(str::to_owned),
        prompt_logprobs: params.prompt_logprobs,
        body,
    })
}

/// The filler text of generated token number `index` (0-based).
pub fn filler_token(index: u32) -> &'static str {
    FILLER_WORDS[index as usize % FILLER_WORDS.len()]
}

/// The filler text of `count` generated tokens.
pub fn filler_text(count: u32) -> String {
    (0..count).map(filler_token).collect()
}

/// What every body of one response shares.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    /// `chatcmpl-…` or `cmpl-…`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// Model name echoed back.
    pub model: String,
    /// Endpoint (decides the object names).
    pub endpoint: ApiKind,
}

impl ResponseMeta {
    /// `id` prefix vLLM uses for this endpoint.
    pub fn id_prefix(endpoint: ApiKind) -> &'static str {
        match endpoint {
            ApiKind::Chat => "chatcmpl-",
            ApiKind::Completions => "cmpl-",
        }
    }

    fn envelope(&self, object: &str, choices: Value) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("id".into(), json!(self.id));
        m.insert("object".into(), json!(object));
        m.insert("created".into(), json!(self.created));
        m.insert("model".into(), json!(self.model));
        m.insert("choices".into(), choices);
        m
    }

    /// The whole non-streamed response.
    pub fn full_response(
        &self,
        text: &str,
        usage: Usage,
        prefill_answer: Option<&PrefillAnswer>,
    ) -> Value {
        let mut choice = match self.endpoint {
            ApiKind::Chat => json!({
                "index": 0,
                "message": { "role": "assistant", "content": text },
                "logprobs": null,
                "finish_reason": "length",
                "stop_reason": null,
            }),
            ApiKind::Completions => json!({
                "index": 0,
                "text": text,
                "logprobs": null,
                "finish_reason": "length",
                "stop_reason": null,
            }),
        };
        if let (Some(PrefillAnswer::Trtllm(params)), Value::Object(choice)) =
            (prefill_answer, &mut choice)
        {
            choice.insert(DISAGGREGATED_PARAMS.into(), json!(params));
        }
        let object = match self.endpoint {
            ApiKind::Chat => "chat.completion",
            ApiKind::Completions => "text_completion",
        };
        let mut m = self.envelope(object, json!([choice]));
        m.insert("usage".into(), usage.to_json());
        if let Some(PrefillAnswer::Vllm(params)) = prefill_answer {
            m.insert(KV_TRANSFER_PARAMS.into(), json!(params));
        }
        Value::Object(m)
    }

    /// A streamed chunk carrying generated text (`first` adds the chat `role`).
    pub fn text_chunk(&self, text: &str, first: bool) -> Value {
        self.chunk(Some(text), first, None)
    }

    /// The streamed chunk that ends the choice.
    pub fn finish_chunk(&self) -> Value {
        self.chunk(None, false, Some("length"))
    }

    fn chunk(&self, text: Option<&str>, first: bool, finish: Option<&str>) -> Value {
        let choice = match self.endpoint {
            ApiKind::Chat => {
                let mut delta = Map::new();
                if first {
                    delta.insert("role".into(), json!("assistant"));
                }
                if let Some(t) = text {
                    delta.insert("content".into(), json!(t));
                }
                json!({ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish })
            }
            ApiKind::Completions => json!({
                "index": 0,
                "text": text.unwrap_or(""),
                "logprobs": null,
                "finish_reason": finish,
            }),
        };
        Value::Object(self.envelope(self.chunk_object(), json!([choice])))
    }

    /// The final streamed chunk with `usage` and no choices (`stream_options.include_usage`).
    pub fn usage_chunk(&self, usage: Usage) -> Value {
        let mut m = self.envelope(self.chunk_object(), json!([]));
        m.insert("usage".into(), usage.to_json());
        Value::Object(m)
    }

    fn chunk_object(&self) -> &'static str {
        match self.endpoint {
            ApiKind::Chat => "chat.completion.chunk",
            ApiKind::Completions => "text_completion",
        }
    }
}
