//! The OpenAI request fields that change what an engine does, validated as vLLM validates
//! them, and the OpenAI-style error a client gets when they are wrong.
//!
//! The control plane checks every routed request with [`generation_params`] and
//! [`check_prompt_length`] *before* any worker does work for it, so a request the engine
//! would refuse costs no prefill and pins no KV: the client gets the engine's own kind of
//! 400 from the gateway. The simulated worker runs the very same checks, so the two never
//! disagree.
//!
//! The rules are vLLM 0.32's (checked against a real vLLM 0.32 on this project's test
//! machines, `docs/vllm.md`): its request models are pydantic models in lax mode, so an
//! integer field also takes a float without a fractional part (`1e3`), a decimal string
//! (`"5"`) and a boolean, and a boolean field also takes `0`/`1` and the strings pydantic
//! reads as booleans (`"yes"`, `"off"`, ...). Then: `max_tokens` (or chat's
//! `max_completion_tokens`, which wins) at least 1 and at most the model's context; `n` at
//! least 1; `stream_options` only with `stream: true`; `truncate_prompt_tokens` from -1 up
//! to the context ([`Truncation`]); a prompt, once cut as that asks, that is not empty and
//! shorter than the model's context.

use serde_json::{json, Map, Value};

use crate::route::ApiKind;

/// Whether a request's `content-type` says JSON as vLLM 0.32 requires of its OpenAI
/// endpoints: the media type (the value lowercased, cut at its first `;`, not trimmed) is
/// exactly `application/json`. No header at all is not JSON: vLLM refuses such a request
/// with a 400 before reading its body.
pub fn is_json_content_type(content_type: Option<&[u8]>) -> bool {
    content_type.is_some_and(|value| {
        let media_type = value.split(|b| *b == b';').next().unwrap_or_default();
        media_type.eq_ignore_ascii_case(b"application/json")
    })
}

/// The error message for a request [`is_json_content_type`] refuses.
pub fn not_json_content_type_error(content_type: Option<&[u8]>) -> String {
    let sent = match content_type {
        None => "no content-type".to_owned(),
        Some(value) => format!("content-type {:?}", String::from_utf8_lossy(value)),
    };
    format!("Unsupported Media Type: only 'application/json' is allowed (the request has {sent})")
}

/// Request-body keys that make a worker reach out to another host (vLLM's NIXL handoff and
/// its encoder-cache connector's `ec_transfer_params`, TensorRT-LLM's disaggregated
/// parameters, SGLang's bootstrap server). Only the gateway may set them: the filter removes
/// them from every client body it passes (the gateway sets no `ec_transfer_params` itself).
pub const CLIENT_STEERING_KEYS: [&str; 7] = [
    "kv_transfer_params",
    "ec_transfer_params",
    "disaggregated_params",
    "bootstrap_host",
    "bootstrap_port",
    "bootstrap_room",
    "bootstrap_pair_key",
];

/// What an engine generates for one request, read from its body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenerationParams {
    /// Stream SSE chunks instead of one JSON body.
    pub stream: bool,
    /// `stream_options.include_usage`: end the stream with a usage chunk.
    pub include_usage: bool,
    /// Tokens to generate at most; `None` leaves it to the engine.
    pub max_tokens: Option<u32>,
    /// Choices to generate (`n`).
    pub n: u32,
    /// The prompt's tokens the engine keeps, when the request asks to cut it.
    pub truncation: Option<Truncation>,
    /// The request names a `cache_salt`: the engine mixes it into its prefix-cache keys, so
    /// the prompt shares no cached block with a prompt without that salt.
    pub salted: bool,
    /// The request asks for prompt logprobs ([`asks_prompt_logprobs`]): vLLM then reads no
    /// cached prefix and computes the whole prompt, so no cache helps it.
    pub prompt_logprobs: bool,
}

/// Which end of a prompt an engine cuts when the request asks it to keep fewer tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TruncationSide {
    /// Keep the last tokens (vLLM's default for generative models).
    Left,
    /// Keep the first tokens.
    Right,
}

/// vLLM's `truncate_prompt_tokens` (with `truncation_side`): the engine serves only `keep`
/// of the prompt's tokens, so the cache it looks up and fills holds those alone. Routing on
/// the whole prompt would match blocks the engine never sees (a left cut shifts every block)
/// and refuse a long prompt the engine would cut and serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncation {
    /// Tokens kept at most (`-1` already resolved against the context).
    pub keep: u32,
    /// The end kept.
    pub side: TruncationSide,
}

impl Truncation {
    /// The part of a prompt of `len` tokens that the engine keeps.
    pub fn kept(self, len: usize) -> std::ops::Range<usize> {
        let keep = (self.keep as usize).min(len);
        match self.side {
            TruncationSide::Left => len - keep..len,
            TruncationSide::Right => 0..keep,
        }
    }

    /// Cuts `tokens` to what the engine keeps.
    pub fn apply(self, tokens: &mut Vec<u32>) {
        let kept = self.kept(tokens.len());
        tokens.truncate(kept.end);
        tokens.drain(..kept.start);
    }
}

/// Which OpenAI error a refused request gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// 400 `BadRequestError`: the body is wrong.
    BadRequest,
    /// 404 `NotFoundError`: the body names a model the gateway does not serve.
    NotFound,
}

impl ErrorKind {
    /// The HTTP status.
    pub fn status(self) -> u16 {
        match self {
            ErrorKind::BadRequest => 400,
            ErrorKind::NotFound => 404,
        }
    }

    /// OpenAI's `error.type`.
    pub fn type_name(self) -> &'static str {
        match self {
            ErrorKind::BadRequest => "BadRequestError",
            ErrorKind::NotFound => "NotFoundError",
        }
    }
}

/// A request an engine would refuse, with the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct InvalidRequest {
    /// 400 or 404.
    pub kind: ErrorKind,
    /// The offending field (`max_tokens`, `messages[1].content`, ...), if one is at fault.
    pub param: Option<String>,
    /// What is wrong, in words a client developer can act on.
    pub message: String,
}

impl InvalidRequest {
    /// A 400 about `param`.
    pub fn bad(param: impl Into<String>, message: impl Into<String>) -> Self {
        InvalidRequest {
            kind: ErrorKind::BadRequest,
            param: Some(param.into()),
            message: message.into(),
        }
    }

    /// The same error about a field of the object `parent` (`stream_options.include_usage`).
    #[must_use]
    pub fn within(mut self, parent: &str) -> Self {
        if let Some(param) = &self.param {
            self.message = self
                .message
                .replacen(param.as_str(), &format!("{parent}.{param}"), 1);
            self.param = Some(format!("{parent}.{param}"));
        }
        self
    }

    /// The OpenAI error body: `{"error": {"message", "type", "param", "code"}}`, as vLLM
    /// answers.
    pub fn to_json(&self) -> Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind.type_name(),
                "param": self.param,
                "code": self.kind.status(),
            }
        })
    }
}

/// Reads and checks the generation fields of a chat or completions body against a model
/// whose context is `max_model_len` tokens.
///
/// # Errors
/// [`InvalidRequest`] naming the first field vLLM would refuse.
pub fn generation_params(
    api: ApiKind,
    body: &Map<String, Value>,
    max_model_len: u32,
) -> Result<GenerationParams, InvalidRequest> {
    let stream = lax_bool(body, "stream")?.unwrap_or(false);
    let include_usage = match body.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(options)) => {
            if !stream {
                return Err(InvalidRequest::bad(
                    "stream_options",
                    "stream_options can only be set when stream is true",
                ));
            }
            lax_bool(options, "include_usage")
                .map_err(|e| e.within("stream_options"))?
                .unwrap_or(false)
        }
        Some(other) => {
            return Err(InvalidRequest::bad(
                "stream_options",
                format!("stream_options must be an object, got {}", type_name(other)),
            ))
        }
    };
    // Completions' `n` is a plain integer in vLLM (`null` refused); chat's may be null.
    if api == ApiKind::Completions && body.get("n").is_some_and(Value::is_null) {
        return Err(InvalidRequest::bad("n", "n must be an integer, got null"));
    }
    let n = match lax_int(body, "n")? {
        None => 1,
        Some(n) if n >= 1 => u32::try_from(n).unwrap_or(u32::MAX),
        Some(_) => {
            return Err(InvalidRequest::bad(
                "n",
                format!("n must be at least 1, got {}", as_sent(body, "n")),
            ))
        }
    };
    // Chat: the newer name wins when both are present, as in vLLM, whose request model
    // still reads the other as an integer but uses only the winner's value.
    let mut max_tokens = None;
    let names: &[&str] = match api {
        ApiKind::Chat => &["max_completion_tokens", "max_tokens"],
        ApiKind::Completions => &["max_tokens"],
    };
    for &name in names {
        let Some(value) = lax_int(body, name)? else {
            continue;
        };
        if max_tokens.is_none() {
            // Completions' `echo` with `max_tokens` 0 answers the prompt alone (scoring its
            // tokens with `logprobs`): vLLM runs it as one token whose text it leaves out.
            if value == 0 && api == ApiKind::Completions && lax_bool(body, "echo")?.unwrap_or(false)
            {
                max_tokens = Some(1);
                continue;
            }
            max_tokens = Some(check_max_tokens(
                name,
                value,
                &as_sent(body, name),
                max_model_len,
            )?);
        }
    }
    match api {
        ApiKind::Chat => check_tool_choice(body)?,
        ApiKind::Completions => check_no_suffix(body)?,
    }
    // vLLM's completions default `max_tokens` to 16; chat leaves it unset.
    let output_asked = max_tokens.is_some() || api == ApiKind::Completions;
    let truncation = truncation(body, output_asked, max_model_len)?;
    let salted = cache_salt(body)?;
    let prompt_logprobs = asks_prompt_logprobs(api, body)?;
    Ok(GenerationParams {
        stream,
        include_usage,
        max_tokens,
        n,
        truncation,
        salted,
        prompt_logprobs,
    })
}

/// Whether a request asks for its prompt's logprobs, as vLLM 0.32 reads it: `prompt_logprobs`
/// set, or `echo` with chat's `top_logprobs` (which defaults to 0) or completions' `logprobs`.
/// vLLM skips reading its prefix cache for such a request: the logprobs of a cached prefix
/// are not computed, so it computes the whole prompt.
fn asks_prompt_logprobs(api: ApiKind, body: &Map<String, Value>) -> Result<bool, InvalidRequest> {
    let set = |field: &str| body.get(field).is_some_and(|v| !v.is_null());
    if set("prompt_logprobs") {
        return Ok(true);
    }
    if !lax_bool(body, "echo")?.unwrap_or(false) {
        return Ok(false);
    }
    Ok(match api {
        ApiKind::Chat => !body.get("top_logprobs").is_some_and(Value::is_null),
        ApiKind::Completions => set("logprobs"),
    })
}

/// Longest `cache_salt` vLLM 0.32 takes, in characters.
const MAX_CACHE_SALT_CHARS: usize = 128;

/// `cache_salt` as vLLM 0.32 checks it: absent or `null`, or a string of 1 to 128 characters
/// without `@`, `/`, `\` or NUL. Whether one is set.
fn cache_salt(body: &Map<String, Value>) -> Result<bool, InvalidRequest> {
    let salt = match body.get("cache_salt") {
        None | Some(Value::Null) => return Ok(false),
        Some(Value::String(salt)) if !salt.is_empty() => salt,
        Some(other) => {
            return Err(InvalidRequest::bad(
                "cache_salt",
                format!(
                    "cache_salt must be a non-empty string if provided, got {}",
                    short(other)
                ),
            ))
        }
    };
    if salt.chars().count() > MAX_CACHE_SALT_CHARS || salt.contains(['@', '/', '\\', '\0']) {
        return Err(InvalidRequest::bad(
            "cache_salt",
            "cache_salt must be at most 128 characters and must not contain '@', '/', '\\' or NUL",
        ));
    }
    Ok(true)
}

/// `truncate_prompt_tokens` and `truncation_side` as vLLM 0.32 reads them: a lax integer
/// from -1 up to the context (-1 keeps the context less one token for the output, or the
/// whole context when the request asks for no output length, `output_asked` false: a chat
/// request without `max_tokens`), the side `"left"` (the default) or `"right"`; `null` is
/// absent. 0 keeps nothing: the empty prompt is then refused as empty.
fn truncation(
    body: &Map<String, Value>,
    output_asked: bool,
    max_model_len: u32,
) -> Result<Option<Truncation>, InvalidRequest> {
    let side = match body.get("truncation_side") {
        None | Some(Value::Null) => TruncationSide::Left,
        Some(Value::String(s)) if s == "left" => TruncationSide::Left,
        Some(Value::String(s)) if s == "right" => TruncationSide::Right,
        Some(other) => {
            return Err(InvalidRequest::bad(
                "truncation_side",
                format!(
                    "truncation_side must be 'left' or 'right', got {}",
                    short(other)
                ),
            ))
        }
    };
    let Some(requested) = lax_int(body, "truncate_prompt_tokens")? else {
        return Ok(None);
    };
    let keep = match requested {
        -1 if output_asked => max_model_len.saturating_sub(1),
        -1 => max_model_len,
        n if n < -1 => {
            return Err(InvalidRequest::bad(
                "truncate_prompt_tokens",
                format!(
                    "truncate_prompt_tokens must be at least -1, got {}",
                    as_sent(body, "truncate_prompt_tokens")
                ),
            ))
        }
        n if n > i128::from(max_model_len) => {
            return Err(InvalidRequest::bad(
                "truncate_prompt_tokens",
                format!(
                    "truncate_prompt_tokens={} cannot be greater than the model's context of {max_model_len} tokens; request a smaller truncation size",
                    as_sent(body, "truncate_prompt_tokens")
                ),
            ))
        }
        n => n as u32,
    };
    Ok(Some(Truncation { keep, side }))
}

/// `tools` and `tool_choice` as vLLM's chat request model checks them: `tools` not empty;
/// a `tool_choice` other than `"none"` only with `tools`, and `"auto"`, `"required"` or a
/// named function that `tools` lists.
fn check_tool_choice(body: &Map<String, Value>) -> Result<(), InvalidRequest> {
    let tools =
        match body.get("tools") {
            None | Some(Value::Null) => None,
            Some(Value::Array(tools)) if tools.is_empty() => return Err(InvalidRequest::bad(
                "tools",
                "tools must not be an empty array: give at least one tool or leave the field out",
            )),
            Some(Value::Array(tools)) => Some(tools),
            // The chat template's preparation names the field for anything else.
            Some(_) => return Ok(()),
        };
    let choice = match body.get("tool_choice") {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::String(s)) if s == "none" => return Ok(()),
        Some(choice) => choice,
    };
    let Some(tools) = tools else {
        return Err(InvalidRequest::bad(
            "tool_choice",
            "tool_choice needs tools: give the tools it chooses from",
        ));
    };
    let usage = r#"name a function as {"type": "function", "function": {"name": "my_function"}}"#;
    let function = match choice {
        Value::String(s) if s == "auto" || s == "required" => return Ok(()),
        Value::Object(named) => named.get("function"),
        other => {
            return Err(InvalidRequest::bad(
                "tool_choice",
                format!(
                "tool_choice must be \"none\", \"auto\", \"required\" or a named function, got {}",
                short(other)
            ),
            ))
        }
    };
    let Some(Value::Object(function)) = function else {
        return Err(InvalidRequest::bad(
            "tool_choice.function",
            format!("tool_choice.function must be an object: {usage}"),
        ));
    };
    let name = match function.get("name") {
        Some(Value::String(name)) if !name.is_empty() => name,
        _ => {
            return Err(InvalidRequest::bad(
                "tool_choice.function.name",
                format!("tool_choice.function.name must be a non-empty string: {usage}"),
            ))
        }
    };
    let listed = tools.iter().any(|tool| {
        tool.get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            == Some(name.as_str())
    });
    if listed {
        Ok(())
    } else {
        Err(InvalidRequest::bad(
            "tool_choice",
            format!("tool_choice names the function {name:?}, which is not among the tools"),
        ))
    }
}

/// A completions `suffix` asks for a fill-in-the-middle prompt, which vLLM renders only for
/// models with FIM rendering and refuses for every other. The gateway routes by the prompt
/// it renders and has no FIM rendering, so it refuses the field whatever the model.
fn check_no_suffix(body: &Map<String, Value>) -> Result<(), InvalidRequest> {
    match body.get("suffix") {
        None | Some(Value::Null) => Ok(()),
        Some(_) => Err(InvalidRequest::bad(
            "suffix",
            "suffix (fill-in-the-middle) is not supported: the gateway cannot render FIM prompts",
        )),
    }
}

/// Refuses `vllm_xargs.kv_cache_report_mode` `"full"`: the gateway's own refusal, not
/// vLLM's (vLLM serves it, and so does the simulated worker). With it, vLLM 0.32 announces the
/// blocks a request found cached as `BlockStored` events of their own, with no new block
/// behind them and so no later `BlockRemoved`; on the wire they look like a second copy of
/// each block (vLLM does cache copies: two requests computing one prefix in a step), so the
/// router's index would keep those blocks after the engine evicted them, and route on cache
/// that is gone. vLLM reads only the exact string `"full"`; anything else is its default.
pub fn check_kv_cache_report_mode(body: &Map<String, Value>) -> Result<(), InvalidRequest> {
    let Some(Value::Object(xargs)) = body.get("vllm_xargs") else {
        return Ok(());
    };
    match xargs.get("kv_cache_report_mode") {
        Some(Value::String(mode)) if mode == "full" => Err(InvalidRequest::bad(
            "vllm_xargs",
            "vllm_xargs.kv_cache_report_mode \"full\" is not served behind this gateway: \
             vLLM would announce cache hits as new blocks, which the router cannot tell from \
             stored copies, so its view of the cache would keep blocks the engine evicted; \
             leave it unset (the router already learns every block vLLM stores)",
        )),
        _ => Ok(()),
    }
}

/// How many prompts a body carries: a completions body's `prompt` may be a batch (an array
/// of strings, or of token-id arrays), each prompt generating `n` sequences of its own; a chat
/// body, a single completions prompt (a string, or one array of token ids) or anything
/// malformed counts as one. The route treats `n` times this as the request's sequences, and
/// a KV handoff carries one, so a batch is never disaggregated.
pub fn prompt_count(api: ApiKind, body: &Map<String, Value>) -> u32 {
    match (api, body.get("prompt")) {
        (ApiKind::Completions, Some(Value::Array(items)))
            if matches!(items.first(), Some(Value::String(_) | Value::Array(_))) =>
        {
            u32::try_from(items.len()).unwrap_or(u32::MAX)
        }
        _ => 1,
    }
}

/// `max_tokens` (or `max_completion_tokens`, as `name` says) of `value`, shown as `sent`, as
/// vLLM 0.32 checks it: at least 1, and not above the model's context.
///
/// # Errors
/// [`InvalidRequest`] (400, param `name`) when it is out of that range.
pub fn check_max_tokens(
    name: &str,
    value: i128,
    sent: &str,
    max_model_len: u32,
) -> Result<u32, InvalidRequest> {
    if value < 1 {
        return Err(InvalidRequest::bad(
            name,
            format!("{name} must be at least 1, got {sent}"),
        ));
    }
    u32::try_from(value)
        .ok()
        .filter(|&tokens| tokens <= max_model_len)
        .ok_or_else(|| {
            InvalidRequest::bad(
                name,
                format!(
                    "{name}={sent} cannot be greater than the model's context of {max_model_len} tokens; request fewer output tokens"
                ),
            )
        })
}

/// Checks that a prompt of `prompt_tokens` can be served: not empty, and leaving room in the
/// model's context for at least one generated token (vLLM 0.32 refuses an empty prompt and
/// one of `max_model_len` tokens or more; a larger `max_tokens` it clamps to what is left).
///
/// # Errors
/// [`InvalidRequest`] (400) when it cannot: param `prompt` for an empty prompt (as vLLM names
/// it), `input_tokens` for a long one.
pub fn check_prompt_length(prompt_tokens: usize, max_model_len: u32) -> Result<(), InvalidRequest> {
    if prompt_tokens == 0 {
        return Err(InvalidRequest::bad(
            "prompt",
            "the prompt is empty: give at least one token to generate from",
        ));
    }
    if prompt_tokens >= max_model_len as usize {
        return Err(InvalidRequest::bad(
            "input_tokens",
            format!(
                "this model's maximum context length is {max_model_len} tokens, and the prompt has {prompt_tokens}, which leaves no room for a generated token; shorten the prompt"
            ),
        ));
    }
    Ok(())
}

/// The tokens an engine generates at most for a prompt of `prompt_tokens` (one that
/// [`check_prompt_length`] passed) asking for `max_tokens`: what is left of the context
/// caps it, as vLLM 0.32 clamps rather than refuses.
pub fn clamp_max_tokens(max_tokens: u32, prompt_tokens: usize, max_model_len: u32) -> u32 {
    let left = (max_model_len as usize).saturating_sub(prompt_tokens);
    max_tokens.min(u32::try_from(left).unwrap_or(u32::MAX))
}

/// A field's value as the client sent it (its JSON), for messages: a huge integer is shown
/// as the float it was read as (`-1e+23`), not as that float's binary digits
/// (`-99999999999999991611392`), which the client never wrote.
fn as_sent(body: &Map<String, Value>, field: &str) -> String {
    body.get(field).map_or_else(String::new, short)
}

/// An integer field as pydantic's lax mode reads it: a JSON integer, a float without a
/// fractional part, or a string holding a decimal integer. `null` and absence are `None`.
fn lax_int(body: &Map<String, Value>, field: &str) -> Result<Option<i128>, InvalidRequest> {
    let value = match body.get(field) {
        None | Some(Value::Null) => return Ok(None),
        Some(v) => v,
    };
    lax_int_value(value).map(Some).ok_or_else(|| {
        InvalidRequest::bad(
            field,
            format!("{field} must be an integer, got {}", short(value)),
        )
    })
}

/// An integer as pydantic's lax mode reads it: a JSON integer, a float without a fractional
/// part, a string holding a decimal integer (surrounding whitespace allowed), or a boolean
/// (`true` is 1: vLLM 0.32 serves `"max_tokens": true` as one token); `None` for anything
/// else. Every integer field of vLLM's request models reads this way, token ids included.
pub fn lax_int_value(value: &Value) -> Option<i128> {
    match value {
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => Some(i128::from(i)),
            (None, Some(u), _) => Some(i128::from(u)),
            // Integral floats within i128 only; 1e300 is "too large" like any huge value.
            (None, None, Some(f)) if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e38 => {
                Some(f as i128)
            }
            _ => None,
        },
        Value::String(s) => lax_int_str(s),
        Value::Bool(b) => Some(i128::from(*b)),
        _ => None,
    }
}

/// A string as pydantic's lax mode reads an integer from it: surrounding whitespace, a sign,
/// digits with single underscores between them (`"1_000"`, as Python's `int()`), and a
/// fractional part of zeros only (`"2.0"`; `"2."` and `"2.5"` are no integers).
fn lax_int_str(s: &str) -> Option<i128> {
    let s = s.trim();
    let whole = match s.split_once('.') {
        Some((whole, zeros)) if !zeros.is_empty() && zeros.bytes().all(|b| b == b'0') => whole,
        Some(_) => return None,
        None => s,
    };
    let digits = whole.strip_prefix(['+', '-']).unwrap_or(whole);
    let underscores_between_digits = digits
        .split('_')
        .all(|group| !group.is_empty() && group.bytes().all(|b| b.is_ascii_digit()));
    if !underscores_between_digits {
        return None;
    }
    whole.replace('_', "").parse::<i128>().ok()
}

/// A boolean value as pydantic's lax mode reads it: a JSON boolean, `0`/`1` (`0.0`/`1.0`), or
/// a string such as `"yes"`/`"off"`; `None` for anything else. Every boolean field of vLLM's request
/// models reads this way (`stream`, `add_special_tokens`, `add_generation_prompt`, ...).
pub fn lax_bool_value(value: &Value) -> Option<bool> {
    match value {
        Value::Bool(b) => Some(*b),
        // `0.0`, `-0.0` and `1.0` too: vLLM 0.32 serves `"stream": 0.0`.
        Value::Number(n) => {
            let f = n.as_f64()?;
            if f == 0.0 {
                Some(false)
            } else if f == 1.0 {
                Some(true)
            } else {
                None
            }
        }
        // Not trimmed: vLLM 0.32 refuses `" yes "`.
        Value::String(s) => match s.to_ascii_lowercase().as_str() {
            "1" | "on" | "t" | "true" | "y" | "yes" => Some(true),
            "0" | "off" | "f" | "false" | "n" | "no" => Some(false),
            _ => None,
        },
        _ => None,
    }
}

/// A boolean field as pydantic's lax mode reads it ([`lax_bool_value`]).
fn lax_bool(body: &Map<String, Value>, field: &str) -> Result<Option<bool>, InvalidRequest> {
    let value = match body.get(field) {
        None | Some(Value::Null) => return Ok(None),
        Some(v) => v,
    };
    lax_bool_value(value).map(Some).ok_or_else(|| {
        InvalidRequest::bad(
            field,
            format!("{field} must be a boolean, got {}", short(value)),
        )
    })
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A value for an error message, cut so a huge field does not make a huge error.
fn short(value: &Value) -> String {
    const MAX: usize = 40;
    let text = value.to_string();
    if text.len() <= MAX {
        return text;
    }
    let cut = (0..=MAX)
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    format!("{}… ({})", &text[..cut], type_name(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONTEXT: u32 = 4096;

    fn params(api: ApiKind, body: Value) -> Result<GenerationParams, InvalidRequest> {
        generation_params(api, body.as_object().expect("object"), CONTEXT)
    }

    fn chat(body: Value) -> Result<GenerationParams, InvalidRequest> {
        params(ApiKind::Chat, body)
    }

    #[test]
    fn a_completions_batch_counts_its_prompts() {
        let count = |api, body: Value| prompt_count(api, body.as_object().unwrap());
        assert_eq!(
            count(ApiKind::Completions, json!({"prompt": ["a", "b", "c"]})),
            3
        );
        assert_eq!(
            count(ApiKind::Completions, json!({"prompt": [[1, 2], [3]]})),
            2
        );
        assert_eq!(
            count(ApiKind::Completions, json!({"prompt": [1, 2, 3]})),
            1,
            "one prompt of ids"
        );
        assert_eq!(count(ApiKind::Completions, json!({"prompt": "a"})), 1);
        assert_eq!(count(ApiKind::Chat, json!({"prompt": ["a", "b"]})), 1);
    }

    #[test]
    fn defaults_when_the_fields_are_absent() {
        assert_eq!(
            chat(json!({"messages": []})),
            Ok(GenerationParams {
                stream: false,
                include_usage: false,
                max_tokens: None,
                n: 1,
                truncation: None,
                salted: false,
                prompt_logprobs: false,
            })
        );
    }

    #[test]
    fn lax_integers_and_booleans_are_read_as_vllm_reads_them() {
        let p = chat(json!({"max_tokens": "5", "stream": "yes", "n": 2.0})).unwrap();
        assert_eq!((p.max_tokens, p.stream, p.n), (Some(5), true, 2));
        let p = chat(json!({"max_tokens": 1e3, "stream": 0})).unwrap();
        assert_eq!((p.max_tokens, p.stream), (Some(1000), false));
        let p = chat(json!({"stream": true, "stream_options": {"include_usage": "on"}})).unwrap();
        assert!(p.include_usage);
        // A boolean is an integer to pydantic: vLLM 0.32 serves `max_tokens: true` (one
        // token) and `n: true`, and refuses `false` as 0.
        let p = chat(json!({"max_tokens": true, "n": true})).unwrap();
        assert_eq!((p.max_tokens, p.n), (Some(1), 1));
        assert_eq!(lax_int_value(&json!(" 11")), Some(11));
        assert_eq!(lax_int_value(&json!("1e1")), None);
        assert_eq!(lax_int_value(&json!(11.5)), None);
        // Strings as a real vLLM 0.32 read them (a differential run against it): served ...
        for (text, read) in [
            ("2.0", 2),
            ("2.00", 2),
            (" 2.0 ", 2),
            ("2.0\n", 2),
            ("1_0", 10),
            ("0_2", 2),
            ("+2", 2),
            ("02", 2),
            ("-1.0", -1),
        ] {
            assert_eq!(lax_int_value(&json!(text)), Some(read), "{text:?}");
        }
        // ... and refused.
        for text in [
            "2.", "2.5", "2e0", "0x2", "\u{662}", "_1", "1_", "1__0", ".0", "", "-",
        ] {
            assert_eq!(lax_int_value(&json!(text)), None, "{text:?}");
        }
        // Completions' `n` may not be null; chat's may.
        assert_eq!(chat(json!({"n": null})).unwrap().n, 1);
        let err = params(ApiKind::Completions, json!({"n": null})).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("n"));
        // Booleans: floats 0 and 1 are booleans, a padded string is not.
        assert_eq!(lax_bool_value(&json!(0.0)), Some(false));
        assert_eq!(lax_bool_value(&json!(-0.0)), Some(false));
        assert_eq!(lax_bool_value(&json!(1.0)), Some(true));
        assert_eq!(lax_bool_value(&json!(2.0)), None);
        assert_eq!(lax_bool_value(&json!(" yes ")), None);
        assert_eq!(lax_bool_value(&json!("YES")), Some(true));
    }

    /// vLLM 0.32's answers (`tests/fixtures/vllm032_chat.json`'s `truncated` section holds
    /// the token ids): the last tokens unless `truncation_side` says right, -1 the context
    /// less the one token the output needs (the whole context without `max_tokens`).
    #[test]
    fn truncation_is_read_as_vllm_reads_it() {
        let cut = |body: Value| chat(body).unwrap().truncation;
        let left = |keep| {
            Some(Truncation {
                keep,
                side: TruncationSide::Left,
            })
        };
        assert_eq!(cut(json!({"truncate_prompt_tokens": 5})), left(5));
        assert_eq!(cut(json!({"truncate_prompt_tokens": "7"})), left(7));
        assert_eq!(cut(json!({"truncate_prompt_tokens": 5.0})), left(5));
        assert_eq!(cut(json!({"truncate_prompt_tokens": true})), left(1));
        assert_eq!(cut(json!({"truncate_prompt_tokens": 0})), left(0));
        assert_eq!(
            cut(json!({"truncate_prompt_tokens": CONTEXT})),
            left(CONTEXT)
        );
        assert_eq!(
            cut(json!({"truncate_prompt_tokens": -1, "max_tokens": 1})),
            left(CONTEXT - 1)
        );
        assert_eq!(cut(json!({"truncate_prompt_tokens": -1})), left(CONTEXT));
        // Completions default `max_tokens` to 16, so -1 keeps room for it there.
        assert_eq!(
            params(ApiKind::Completions, json!({"truncate_prompt_tokens": -1}))
                .unwrap()
                .truncation,
            left(CONTEXT - 1)
        );
        assert_eq!(
            cut(json!({"truncate_prompt_tokens": 5, "truncation_side": "right"})),
            Some(Truncation {
                keep: 5,
                side: TruncationSide::Right
            })
        );
        assert_eq!(cut(json!({"truncate_prompt_tokens": null})), None);
        assert_eq!(cut(json!({"truncation_side": "left"})), None);
        for (body, field) in [
            (
                json!({"truncate_prompt_tokens": CONTEXT + 1}),
                "truncate_prompt_tokens",
            ),
            (
                json!({"truncate_prompt_tokens": -2}),
                "truncate_prompt_tokens",
            ),
            (
                json!({"truncate_prompt_tokens": "x"}),
                "truncate_prompt_tokens",
            ),
            (
                json!({"truncate_prompt_tokens": 5, "truncation_side": "middle"}),
                "truncation_side",
            ),
            (json!({"truncation_side": 1}), "truncation_side"),
        ] {
            let err = chat(body.clone()).expect_err(&body.to_string());
            assert_eq!(err.param.as_deref(), Some(field), "{body}: {err}");
        }
    }

    #[test]
    fn a_full_kv_cache_report_is_refused() {
        let check = |body: Value| check_kv_cache_report_mode(body.as_object().expect("object"));
        let full = json!({"vllm_xargs": {"kv_cache_report_mode": "full"}});
        let err = check(full.clone()).expect_err("full");
        assert_eq!(err.param.as_deref(), Some("vllm_xargs"));
        assert!(
            err.message.contains("kv_cache_report_mode"),
            "{}",
            err.message
        );
        // vLLM serves it: the engine's own checks (the simulated worker's) pass it.
        assert!(params(ApiKind::Chat, full).is_ok());
        for fine in [
            json!({"vllm_xargs": {"kv_cache_report_mode": "incremental"}}),
            json!({"vllm_xargs": {"kv_cache_report_mode": "FULL"}}),
            json!({"vllm_xargs": {"session_id": "s-1"}}),
            json!({"vllm_xargs": null}),
            json!({}),
        ] {
            assert!(check(fine.clone()).is_ok(), "{fine}");
        }
    }

    #[test]
    fn a_cache_salt_is_a_short_plain_string() {
        assert!(!chat(json!({})).unwrap().salted);
        assert!(!chat(json!({"cache_salt": null})).unwrap().salted);
        assert!(chat(json!({"cache_salt": "tenant-b-9f2c"})).unwrap().salted);
        assert!(chat(json!({"cache_salt": "é".repeat(128)})).unwrap().salted);
        for bad in [
            json!(""),
            json!(5),
            json!(["a"]),
            json!("a@b"),
            json!("a/b"),
            json!("a\\b"),
            json!("a\u{0}b"),
            json!("x".repeat(129)),
        ] {
            let err = chat(json!({ "cache_salt": bad })).expect_err(&bad.to_string());
            assert_eq!(err.param.as_deref(), Some("cache_salt"), "{bad}");
        }
    }

    #[test]
    fn a_truncation_keeps_the_end_it_names() {
        let tokens: Vec<u32> = (1..=7).collect();
        let cut = |keep, side| {
            let mut t = tokens.clone();
            Truncation { keep, side }.apply(&mut t);
            t
        };
        assert_eq!(cut(3, TruncationSide::Left), vec![5, 6, 7]);
        assert_eq!(cut(3, TruncationSide::Right), vec![1, 2, 3]);
        assert_eq!(cut(100, TruncationSide::Left), tokens);
        assert!(cut(0, TruncationSide::Left).is_empty());
    }

    #[test]
    fn the_refusals_of_vllm_are_refused_naming_the_field() {
        let cases = [
            (json!({"max_tokens": -1}), "max_tokens"),
            (json!({"max_tokens": 0}), "max_tokens"),
            (json!({"max_tokens": 1e12}), "max_tokens"),
            (json!({"max_tokens": 2.5}), "max_tokens"),
            (json!({"max_tokens": "x"}), "max_tokens"),
            (json!({"max_tokens": false}), "max_tokens"),
            (
                json!({"max_completion_tokens": 0, "max_tokens": 5}),
                "max_completion_tokens",
            ),
            (json!({"stream": "maybe"}), "stream"),
            (json!({"stream": 2}), "stream"),
            (
                json!({"stream_options": {"include_usage": true}}),
                "stream_options",
            ),
            (
                json!({"stream": true, "stream_options": 3}),
                "stream_options",
            ),
            (json!({"n": 0}), "n"),
            (json!({"n": "two"}), "n"),
        ];
        for (body, field) in cases {
            let err = chat(body.clone()).expect_err(&body.to_string());
            assert_eq!(err.param.as_deref(), Some(field), "{body}: {err}");
            assert_eq!(err.kind, ErrorKind::BadRequest);
            assert!(err.message.contains(field), "{err}");
        }
    }

    #[test]
    fn chat_prefers_max_completion_tokens_and_completions_ignores_it() {
        let body = json!({"max_completion_tokens": 7, "max_tokens": 9});
        assert_eq!(chat(body.clone()).unwrap().max_tokens, Some(7));
        assert_eq!(
            params(ApiKind::Completions, body).unwrap().max_tokens,
            Some(9)
        );
        // The losing max_tokens is read as an integer, but its value is not checked: vLLM
        // uses max_completion_tokens alone.
        for losing in [json!(0), json!(CONTEXT + 1), json!(-5)] {
            let body = json!({"max_completion_tokens": 10, "max_tokens": losing});
            assert_eq!(chat(body).unwrap().max_tokens, Some(10));
        }
        let err = chat(json!({"max_completion_tokens": 10, "max_tokens": "x"})).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("max_tokens"));
        // A null max_completion_tokens is absent: max_tokens decides, and is checked.
        let err = chat(json!({"max_completion_tokens": null, "max_tokens": 0})).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("max_tokens"));
    }

    #[test]
    fn a_refused_number_is_shown_as_the_client_wrote_it() {
        let err = chat(json!({"n": -1e23})).unwrap_err();
        assert!(err.message.ends_with("got -1e+23"), "{err}");
        let err = chat(json!({"max_tokens": "0"})).unwrap_err();
        assert!(err.message.ends_with("got \"0\""), "{err}");
    }

    #[test]
    fn a_nested_field_is_named_with_its_parent() {
        let err = chat(json!({"stream": true, "stream_options": {"include_usage": "maybe"}}))
            .unwrap_err();
        assert_eq!(err.param.as_deref(), Some("stream_options.include_usage"));
        assert!(
            err.message
                .starts_with("stream_options.include_usage must be"),
            "{err}"
        );
    }

    #[test]
    fn tool_choice_is_checked_against_the_tools_as_vllm_does() {
        let tools = json!([{"type": "function", "function": {"name": "f"}}]);
        for ok in [
            json!({"tools": tools}),
            json!({"tool_choice": "none"}),
            json!({"tool_choice": null}),
            json!({"tools": tools, "tool_choice": "auto"}),
            json!({"tools": tools, "tool_choice": "required"}),
            json!({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "f"}}}),
        ] {
            assert!(chat(ok.clone()).is_ok(), "{ok}");
        }
        for (bad, param, words) in [
            (json!({"tools": []}), "tools", "empty"),
            (
                json!({"tool_choice": "required"}),
                "tool_choice",
                "needs tools",
            ),
            (json!({"tool_choice": "auto"}), "tool_choice", "needs tools"),
            (
                json!({"tools": tools, "tool_choice": "always"}),
                "tool_choice",
                "\"always\"",
            ),
            (
                json!({"tools": tools, "tool_choice": 3}),
                "tool_choice",
                "got 3",
            ),
            (
                json!({"tools": tools, "tool_choice": {"type": "function"}}),
                "tool_choice.function",
                "object",
            ),
            (
                json!({"tools": tools, "tool_choice": {"function": {"name": ""}}}),
                "tool_choice.function.name",
                "non-empty",
            ),
            (
                json!({"tools": tools, "tool_choice": {"function": {"name": "g"}}}),
                "tool_choice",
                "\"g\", which is not among the tools",
            ),
        ] {
            let err = chat(bad.clone()).expect_err(&bad.to_string());
            assert_eq!(err.param.as_deref(), Some(param), "{bad}: {err}");
            assert!(err.message.contains(words), "{bad}: {err}");
        }
        // Completions bodies have no tools: the fields are not theirs to check.
        assert!(params(ApiKind::Completions, json!({"tool_choice": "required"})).is_ok());
    }

    #[test]
    fn only_a_json_media_type_is_json() {
        for ok in [
            &b"application/json"[..],
            b"Application/JSON",
            b"application/json; charset=utf-8",
            b"application/json;",
        ] {
            assert!(is_json_content_type(Some(ok)), "{ok:?}");
        }
        for not in [
            &b"application/x-www-form-urlencoded"[..],
            b"text/plain",
            b"application/vnd.api+json",
            b"application/json ; charset=utf-8",
            b" application/json",
            b"",
        ] {
            assert!(!is_json_content_type(Some(not)), "{not:?}");
        }
        assert!(!is_json_content_type(None));
        assert!(not_json_content_type_error(Some(b"text/plain")).contains("\"text/plain\""));
    }

    #[test]
    fn completions_echo_may_generate_nothing() {
        let p = params(ApiKind::Completions, json!({"echo": true, "max_tokens": 0})).unwrap();
        assert_eq!(p.max_tokens, Some(1), "vLLM runs it as one token");
        assert!(params(
            ApiKind::Completions,
            json!({"echo": "true", "max_tokens": false})
        )
        .is_ok());
        for refused in [
            (ApiKind::Completions, json!({"max_tokens": 0})),
            (
                ApiKind::Completions,
                json!({"echo": false, "max_tokens": 0}),
            ),
            (ApiKind::Chat, json!({"echo": true, "max_tokens": 0})),
        ] {
            let err = params(refused.0, refused.1.clone()).unwrap_err();
            assert_eq!(err.param.as_deref(), Some("max_tokens"), "{}", refused.1);
        }
    }

    #[test]
    fn prompt_logprobs_are_asked_as_vllm_reads_them() {
        let asks = |api, body: Value| params(api, body).unwrap().prompt_logprobs;
        for api in [ApiKind::Chat, ApiKind::Completions] {
            assert!(!asks(api, json!({})));
            assert!(asks(api, json!({"prompt_logprobs": 0})));
            assert!(asks(api, json!({"prompt_logprobs": -1})));
            assert!(!asks(api, json!({"prompt_logprobs": null})));
            assert!(!asks(api, json!({"echo": false, "logprobs": 1})));
        }
        // Chat's echo takes `top_logprobs` (default 0) as the prompt's.
        assert!(asks(ApiKind::Chat, json!({"echo": true})));
        assert!(asks(
            ApiKind::Chat,
            json!({"echo": "yes", "top_logprobs": 2})
        ));
        assert!(!asks(
            ApiKind::Chat,
            json!({"echo": true, "top_logprobs": null})
        ));
        // Completions' echo takes `logprobs` (default none).
        assert!(!asks(ApiKind::Completions, json!({"echo": true})));
        assert!(asks(
            ApiKind::Completions,
            json!({"echo": true, "logprobs": 0})
        ));
        assert!(!asks(
            ApiKind::Completions,
            json!({"echo": true, "logprobs": null})
        ));
        let err = chat(json!({"echo": "maybe"})).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("echo"));
    }

    #[test]
    fn a_completions_suffix_is_refused() {
        let err = params(
            ApiKind::Completions,
            json!({"prompt": "a", "suffix": "end"}),
        )
        .unwrap_err();
        assert_eq!(err.param.as_deref(), Some("suffix"));
        assert!(params(ApiKind::Completions, json!({"prompt": "a", "suffix": null})).is_ok());
        assert!(chat(json!({"suffix": "end"})).is_ok(), "not a chat field");
    }

    #[test]
    fn max_tokens_may_reach_the_context_but_not_pass_it() {
        assert_eq!(
            chat(json!({"max_tokens": CONTEXT})).unwrap().max_tokens,
            Some(CONTEXT)
        );
        assert!(chat(json!({"max_tokens": CONTEXT + 1})).is_err());
    }

    #[test]
    fn max_tokens_beyond_what_the_context_leaves_is_clamped() {
        assert_eq!(clamp_max_tokens(20, 9, 20), 11);
        assert_eq!(clamp_max_tokens(5, 9, 20), 5);
        assert_eq!(clamp_max_tokens(5, 19, 20), 1);
    }

    #[test]
    fn prompts_that_leave_no_room_to_generate_or_are_empty_are_refused() {
        assert!(check_prompt_length(1, CONTEXT).is_ok());
        assert!(check_prompt_length(CONTEXT as usize - 1, CONTEXT).is_ok());
        let err = check_prompt_length(CONTEXT as usize, CONTEXT).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("input_tokens"));
        assert!(err.message.contains("4096"), "{err}");
        let err = check_prompt_length(CONTEXT as usize + 1, CONTEXT).unwrap_err();
        assert!(err.message.contains("4097"), "{err}");
        let err = check_prompt_length(0, CONTEXT).unwrap_err();
        assert!(err.message.contains("empty"), "{err}");
        assert_eq!(err.param.as_deref(), Some("prompt"), "as vLLM names it");
    }

    #[test]
    fn the_error_body_is_openai_shaped_and_bounded() {
        let huge = "9".repeat(10_000);
        let err = chat(json!({ "max_tokens": huge })).unwrap_err();
        let body = err.to_json();
        assert_eq!(body["error"]["type"], "BadRequestError");
        assert_eq!(body["error"]["code"], 400);
        assert_eq!(body["error"]["param"], "max_tokens");
        assert!(body.to_string().len() < 300, "{body}");
    }
}
