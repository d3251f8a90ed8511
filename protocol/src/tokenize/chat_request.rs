//! A chat completions body -> the variables its chat template sees, prepared the way vLLM
//! prepares them before calling transformers' `apply_chat_template`.
//!
//! What vLLM does (`vllm/renderers/chat_utils.py`, "string" content format, which is what
//! templates that treat `message.content` as a string get, Qwen3's among them):
//! - `content`: a string stays; missing becomes `""`, and so does `null` for assistants (other
//!   roles are refused); a list of parts becomes the texts of its text-like parts (`text`,
//!   `input_text`, `output_text`, `refusal`, `thinking`, `tool_reference`) joined with `"\n"`,
//!   empty texts dropped. Media parts need a multimodal model, which this tokenizer is not:
//!   they are rejected. In system messages, Claude Code's billing header line is dropped.
//! - each message is rebuilt as `{role, content}` plus, for assistants, `tool_calls` (an empty
//!   list is dropped; string `arguments` are parsed as JSON, `{}` unless they hold an object)
//!   and `reasoning` (copied to `reasoning_content` too); for tools `tool_call_id`; `name` and
//!   `task` if they are strings; for developers `tools`. Other keys are dropped.
//! - if the template never names the `developer` role, developer messages become system
//!   messages and system messages are merged at the front (`developer_role`).
//! - `tools` are serialized with their declared fields only (`chat_messages::tool_value`).
//! - then transformers (5.x) drops `None`-valued message keys and aliases reasoning to
//!   `thinking` (first key) and `reasoning_content` (last key).
//! - `chat_template_kwargs` are template variables, but the request's own
//!   `add_generation_prompt` (default true), `continue_final_message`, and, when set,
//!   `documents` and `reasoning_effort` win over them; `reasoning_effort` also sets
//!   `enable_thinking` unless the kwargs do.

use std::borrow::Cow;
use std::sync::Arc;

use minijinja::Value;
use serde_json::{Map, Value as Json};

use super::chat_messages::{message_value, prepare_message, tool_value};
use super::developer_role::developer_as_system;
use super::error::TokenizeError;
use super::ordered::{json_to_value, OrderedMap};

/// The values vLLM's request model accepts for `reasoning_effort`.
const REASONING_EFFORTS: [&str; 7] = ["none", "minimal", "low", "medium", "high", "xhigh", "max"];

/// Template kwargs that transformers' `apply_chat_template` takes as its own parameters, which
/// vLLM always fills from the request's fields: the client's values never reach the template.
const REQUEST_OWNED_KWARGS: [&str; 3] = [
    "messages",
    "add_generation_prompt",
    "continue_final_message",
];

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

/// Prepares `body` for the template; `special_tokens` are the tokenizer's `bos_token`, ...;
/// `template_knows_developer_role` is [`super::template::ChatTemplate::knows_developer_role`].
pub(crate) fn prepare_chat(
    body: &Json,
    special_tokens: &[(&'static str, String)],
    template_knows_developer_role: bool,
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
    // These two always have a value, so vLLM's `merge_kwargs` lets them override the kwargs.
    let add_generation_prompt = bool_field(body, "add_generation_prompt", true)?;
    let continue_final_message = bool_field(body, "continue_final_message", false)?;
    let add_special_tokens = bool_field(body, "add_special_tokens", false)?;
    let reasoning_effort = reasoning_effort(body)?;
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
    if !template_knows_developer_role {
        // Before the final message is tagged: the merge can change which message is last.
        messages = developer_as_system(messages);
    }

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
        Some(Json::Array(tools)) if tools.is_empty() => {
            return Err(TokenizeError::invalid(
                "tools",
                "must not be an empty array; give at least one tool or omit the field",
            ))
        }
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
    context.insert(Arc::from("documents"), Value::from(()));
    context.insert(
        Arc::from("add_generation_prompt"),
        Value::from(add_generation_prompt),
    );
    for (key, value) in kwargs.into_iter().flatten() {
        if !REQUEST_OWNED_KWARGS.contains(&key.as_str()) {
            context.insert(Arc::from(key.as_str()), json_to_value(value));
        }
    }
    // vLLM merges these over the kwargs only when the request sets them.
    if let Some(documents) = body.get("documents").filter(|d| !d.is_null()) {
        context.insert(Arc::from("documents"), json_to_value(documents));
    }
    if let Some(effort) = reasoning_effort {
        context.insert(Arc::from("reasoning_effort"), Value::from(effort));
        if !kwargs.is_some_and(|k| k.contains_key("enable_thinking")) {
            context.insert(Arc::from("enable_thinking"), Value::from(effort != "none"));
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

/// The body's `reasoning_effort`, `None` if missing or null.
fn reasoning_effort(body: &Map<String, Json>) -> Result<Option<&str>, TokenizeError> {
    match body.get("reasoning_effort") {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(effort)) if REASONING_EFFORTS.contains(&effort.as_str()) => {
            Ok(Some(effort))
        }
        Some(_) => Err(TokenizeError::invalid(
            "reasoning_effort",
            format!("must be one of {} or null", REASONING_EFFORTS.join(", ")),
        )),
    }
}

/// A boolean field read as vLLM's pydantic models read it (`crate::openai::lax_bool_value`).
/// Its fields are plain `bool`s there, so `null` is refused as any other non-boolean.
pub(crate) fn bool_field(
    body: &Map<String, Json>,
    field: &str,
    default: bool,
) -> Result<bool, TokenizeError> {
    match body.get(field) {
        None => Ok(default),
        Some(value) => crate::openai::lax_bool_value(value).ok_or_else(|| {
            TokenizeError::invalid(
                field,
                "must be a boolean (true or false, 0 or 1, or a string such as \"yes\" or \"off\")",
            )
        }),
    }
}
