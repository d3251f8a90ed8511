//! A chat completions body -> the variables its chat template sees, prepared the way vLLM
//! prepares them before calling transformers' `apply_chat_template`.
//!
//! What vLLM does (`vllm/entrypoints/chat_utils.py`, "string" content format, which is what
//! templates that treat `message.content` as a string get, Qwen3's among them):
//! - `content`: a string stays; `null`/missing becomes `""`; a list of parts becomes the texts
//!   of its text-like parts (`text`, `input_text`, `output_text`, `refusal`, `thinking`,
//!   `tool_reference`) joined with `"\n"`, empty texts dropped. Media parts need a multimodal
//!   model, which this tokenizer is not: they are rejected.
//! - each message is rebuilt as `{role, content}` plus, for assistants, `tool_calls` (an empty
//!   list is dropped; string `arguments` are parsed as JSON, `{}` if invalid) and `reasoning`
//!   (copied to `reasoning_content` too); for tools `tool_call_id`; `name` and `task` if they are
//!   strings; for developers `tools`. Other keys are dropped.
//! - `tools` are pydantic-dumped: `{"type": "function", "function": {"name", "description",
//!   "parameters", ...extra keys}, ...extra keys}`, missing description/parameters as `null`.
//! - then transformers (5.x) drops `None`-valued message keys and aliases reasoning to
//!   `thinking` (first key) and `reasoning_content` (last key).
//! - `add_generation_prompt` defaults to true; `chat_template_kwargs` override every variable.

use std::borrow::Cow;
use std::sync::Arc;

use minijinja::Value;
use serde_json::{Map, Value as Json};

use super::chat_messages::{message_value, prepare_message, tool_value};
use super::error::TokenizeError;
use super::ordered::{json_to_value, OrderedMap};

/// transformers appends this to the final message for `continue_final_message` and cuts the
/// rendered prompt there.
const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";

/// A chat body ready to render.
#[derive(Debug)]
pub(crate) struct PreparedChat {
    /// The template's variables.
    pub context: Value,
    /// With `continue_final_message`: the final message's content, to cut the render after it.
    pub continue_final: Option<String>,
    /// The body's `add_special_tokens` (vLLM's chat default: false).
    pub add_special_tokens: bool,
}

/// Prepares `body` for the template; `special_tokens` are the tokenizer's `bos_token`, ...
pub(crate) fn prepare_chat(
    body: &Json,
    special_tokens: &[(&'static str, String)],
) -> Result<PreparedChat, TokenizeError> {
    let body = body
        .as_object()
        .ok_or_else(|| TokenizeError::invalid("body", "must be a JSON object"))?;
    if body.get("chat_template").is_some_and(|t| !t.is_null()) {
        return Err(TokenizeError::invalid(
            "chat_template",
            "request-supplied chat templates are not accepted; the model's template is used",
        ));
    }
    let kwargs = match body.get("chat_template_kwargs") {
        None | Some(Json::Null) => None,
        Some(Json::Object(map)) => Some(map),
        Some(_) => {
            return Err(TokenizeError::invalid(
                "chat_template_kwargs",
                "must be an object",
            ))
        }
    };
    let mut add_generation_prompt = bool_field(body, "add_generation_prompt", true)?;
    let mut continue_final_message = bool_field(body, "continue_final_message", false)?;
    let add_special_tokens = bool_field(body, "add_special_tokens", false)?;
    if let Some(kwargs) = kwargs {
        add_generation_prompt = kwargs
            .get("add_generation_prompt")
            .map_or(add_generation_prompt, Json::is_true_ish);
        continue_final_message = kwargs
            .get("continue_final_message")
            .map_or(continue_final_message, Json::is_true_ish);
    }
    if add_generation_prompt && continue_final_message {
        return Err(TokenizeError::invalid(
            "continue_final_message",
            "cannot be true together with add_generation_prompt",
        ));
    }

    let raw_messages = match body.get("messages") {
        None | Some(Json::Null) => return Err(TokenizeError::invalid("messages", "is required")),
        Some(Json::Array(items)) if items.is_empty() => {
            return Err(TokenizeError::invalid("messages", "must not be empty"))
        }
        Some(Json::Array(items)) => items,
        Some(_) => {
            return Err(TokenizeError::invalid(
                "messages",
                "must be an array of messages",
            ))
        }
    };
    let mut messages = raw_messages
        .iter()
        .enumerate()
        .map(|(i, m)| prepare_message(i, m))
        .collect::<Result<Vec<_>, _>>()?;

    let mut continue_final = None;
    if continue_final_message {
        let last = messages.last_mut().expect("messages is not empty");
        let content = last.iter_mut().find(|(k, _)| &**k == "content");
        match content
            .and_then(|(_, value)| value.as_mut())
            .map(Cow::to_mut)
        {
            Some(Json::String(text)) => {
                continue_final = Some(text.clone());
                text.push_str(CONTINUE_TAG);
            }
            _ => {
                return Err(TokenizeError::invalid(
                    "continue_final_message",
                    "the final message has no text content to continue",
                ))
            }
        }
    }

    let messages: Vec<Value> = messages.into_iter().map(message_value).collect();
    let tools = match body.get("tools") {
        None | Some(Json::Null) => Value::from(()),
        Some(Json::Array(tools)) => tools
            .iter()
            .enumerate()
            .map(|(i, t)| tool_value(i, t))
            .collect::<Result<Vec<_>, _>>()?
            .into(),
        Some(_) => return Err(TokenizeError::invalid("tools", "must be an array")),
    };

    let mut context = OrderedMap::default();
    for (name, token) in special_tokens {
        context.insert(Arc::from(*name), Value::from(token.as_str()));
    }
    context.insert(Arc::from("messages"), Value::from(messages));
    context.insert(Arc::from("tools"), tools);
    context.insert(
        Arc::from("documents"),
        body.get("documents").map_or(Value::from(()), json_to_value),
    );
    context.insert(
        Arc::from("add_generation_prompt"),
        Value::from(add_generation_prompt),
    );
    for (key, value) in kwargs.into_iter().flatten() {
        if key != "messages" {
            context.insert(Arc::from(key.as_str()), json_to_value(value));
        }
    }
    Ok(PreparedChat {
        context: context.into_value(),
        continue_final,
        add_special_tokens,
    })
}

/// Cuts a `continue_final_message` render right after the final message's text, as
/// transformers does.
pub(crate) fn cut_after_final_message(
    rendered: String,
    final_content: &str,
) -> Result<String, TokenizeError> {
    let tag = CONTINUE_TAG.trim();
    if !rendered.contains(final_content.trim()) || !rendered.contains(tag) {
        return Err(TokenizeError::invalid(
            "continue_final_message",
            "the chat template drops part of the final message, so it cannot be continued",
        ));
    }
    let at = rendered.rfind(tag).unwrap_or(rendered.len());
    let mut rendered = rendered;
    if rendered[at..].starts_with(CONTINUE_TAG) {
        rendered.truncate(at);
    } else {
        let kept = rendered[..at].trim_end().len();
        rendered.truncate(kept);
    }
    Ok(rendered)
}

trait TrueIsh {
    fn is_true_ish(&self) -> bool;
}

impl TrueIsh for Json {
    /// Python truthiness of a JSON value passed as a template kwarg.
    fn is_true_ish(&self) -> bool {
        match self {
            Json::Null => false,
            Json::Bool(b) => *b,
            Json::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
            Json::String(s) => !s.is_empty(),
            Json::Array(a) => !a.is_empty(),
            Json::Object(o) => !o.is_empty(),
        }
    }
}

/// A boolean field read as vLLM's pydantic models read it (`crate::openai::lax_bool_value`).
pub(crate) fn bool_field(
    body: &Map<String, Json>,
    field: &str,
    default: bool,
) -> Result<bool, TokenizeError> {
    match body.get(field) {
        None | Some(Json::Null) => Ok(default),
        Some(value) => crate::openai::lax_bool_value(value).ok_or_else(|| {
            TokenizeError::invalid(
                field,
                "must be a boolean (true or false, 0 or 1, or a string such as \"yes\" or \"off\")",
            )
        }),
    }
}
