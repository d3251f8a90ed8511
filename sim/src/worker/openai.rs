//! The OpenAI request fields a simulated worker acts on, and the response bodies it sends.
//!
//! Requests stay `serde_json::Value`s (key order preserved) because the tokenizer renders the
//! chat template from the body as the client sent it; only the fields that change what the
//! worker does are pulled out and validated here. Responses follow vLLM's shapes
//! (`chat.completion`, `chat.completion.chunk`, `text_completion`) so clients and the
//! Switchyard filter cannot tell a simulated worker from a real one. **The generated text is
//! filler**: no model runs, so every token is a word from [`FILLER_WORDS`].

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use switchyard_protocol::route::ApiKind;

use super::error::ApiError;

/// `max_tokens` when a request names none (vLLM would fill the context; a short default keeps
/// forgotten fields from tying a simulated worker up for minutes).
pub const DEFAULT_MAX_TOKENS: u32 = 16;
/// Largest `max_tokens` accepted (Qwen3's context length).
pub const MAX_MAX_TOKENS: u32 = 262_144;

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

/// `kv_transfer_params` as vLLM's NixlConnector reads and writes them. Unknown fields are
/// ignored, missing ones default, so bodies from real proxies and from our filter both parse.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KvTransferParams {
    /// Set on the prefill leg: compute the KV and hold it for a decode worker.
    #[serde(default)]
    pub do_remote_decode: bool,
    /// Set on the decode leg: pull the KV named below instead of prefilling.
    #[serde(default)]
    pub do_remote_prefill: bool,
    /// The prefill worker (its worker id).
    #[serde(default)]
    pub remote_engine_id: Option<String>,
    /// Engine block ids held on the prefill worker. Kept as JSON: newer vLLM sends one list
    /// per KV cache group (`[[...]]`), and the simulated pull does not need them.
    #[serde(default)]
    pub remote_block_ids: Option<Value>,
    /// The hold's id on the prefill worker (vLLM: the prefill request's id).
    #[serde(default)]
    pub remote_request_id: Option<String>,
    /// Host of the prefill worker's side channel (here: its HTTP API).
    #[serde(default)]
    pub remote_host: Option<String>,
    /// Port of the prefill worker's side channel (here: its HTTP API).
    #[serde(default)]
    pub remote_port: Option<u16>,
    /// Tensor-parallel size of the prefill worker.
    #[serde(default)]
    pub tp_size: Option<u32>,
}

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
    /// The KV handoff fields, if any.
    pub kv_transfer: Option<KvTransferParams>,
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

/// Reads the fields the worker acts on and rejects what vLLM would reject.
///
/// # Errors
/// [`ApiError`] (400) naming the offending field.
pub fn parse_request(endpoint: ApiKind, body: Value) -> Result<ParsedRequest, ApiError> {
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
    let stream = opt_bool(obj, "stream")?.unwrap_or(false);
    let include_usage = match obj.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(opts)) => {
            if !stream {
                return Err(ApiError::bad_request(
                    "stream_options can only be set when stream is true",
                    Some("stream_options"),
                ));
            }
            opt_bool(opts, "include_usage")?.unwrap_or(false)
        }
        Some(_) => {
            return Err(ApiError::bad_request(
                "`stream_options` must be an object",
                Some("stream_options"),
            ))
        }
    };
    match obj.get("n") {
        None | Some(Value::Null) => {}
        Some(n) if n.as_u64() == Some(1) => {}
        Some(_) => {
            return Err(ApiError::bad_request(
                "only n = 1 is supported by the simulated worker",
                Some("n"),
            ))
        }
    }
    let max_tokens = match endpoint {
        // Chat: the newer name wins when both are present, as in vLLM.
        ApiKind::Chat => match opt_max_tokens(obj, "max_completion_tokens")? {
            Some(n) => Some(n),
            None => opt_max_tokens(obj, "max_tokens")?,
        },
        ApiKind::Completions => opt_max_tokens(obj, "max_tokens")?,
    }
    .unwrap_or(DEFAULT_MAX_TOKENS);
    let kv_transfer = match obj.get("kv_transfer_params") {
        None | Some(Value::Null) => None,
        Some(v) => Some(KvTransferParams::deserialize(v).map_err(|e| {
            ApiError::bad_request(
                format!("invalid kv_transfer_params: {e}"),
                Some("kv_transfer_params"),
            )
        })?),
    };
    Ok(ParsedRequest {
        endpoint,
        model,
        stream,
        include_usage,
        max_tokens,
        kv_transfer,
        body,
    })
}

fn opt_bool(obj: &Map<String, Value>, field: &'static str) -> Result<Option<bool>, ApiError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::bad_request(
            format!("`{field}` must be a boolean"),
            Some(field),
        )),
    }
}

fn opt_max_tokens(obj: &Map<String, Value>, field: &'static str) -> Result<Option<u32>, ApiError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if (1..=u64::from(MAX_MAX_TOKENS)).contains(&n) => Ok(Some(n as u32)),
            _ => Err(ApiError::bad_request(
                format!("`{field}` must be an integer between 1 and {MAX_MAX_TOKENS}, got {v}"),
                Some(field),
            )),
        },
    }
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
        kv_transfer_params: Option<&KvTransferParams>,
    ) -> Value {
        let choice = match self.endpoint {
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
        let object = match self.endpoint {
            ApiKind::Chat => "chat.completion",
            ApiKind::Completions => "text_completion",
        };
        let mut m = self.envelope(object, json!([choice]));
        m.insert("usage".into(), usage.to_json());
        if let Some(params) = kv_transfer_params {
            m.insert("kv_transfer_params".into(), json!(params));
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
