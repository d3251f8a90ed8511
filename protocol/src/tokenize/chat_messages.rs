//! The per-message and per-tool rewrites vLLM applies to a chat body before templating (see
//! `chat_request` for the overview).

use std::borrow::Cow;
use std::sync::Arc;

use minijinja::Value;
use serde_json::{Map, Value as Json};

use super::error::TokenizeError;
use super::ordered::{json_to_value, OrderedMap};

/// One message's keys in vLLM's order; `None` values are dropped later. Values the body
/// already holds as they are (a string `content`, `reasoning`, ...) are borrowed from it: a
/// long message's text is copied once, into its template value, not also into an entry.
pub(crate) type MessageEntries<'a> = Vec<(Arc<str>, Option<Cow<'a, Json>>)>;

/// Message `i` rebuilt as vLLM rebuilds it (content flattened, only the keys vLLM keeps).
pub(crate) fn prepare_message(
    i: usize,
    message: &Json,
) -> Result<MessageEntries<'_>, TokenizeError> {
    let field = |name: &str| format!("messages[{i}].{name}");
    let message = message
        .as_object()
        .ok_or_else(|| TokenizeError::invalid(format!("messages[{i}]"), "must be an object"))?;
    let role = match message.get("role") {
        Some(Json::String(role)) => role.as_str(),
        Some(_) => return Err(TokenizeError::invalid(field("role"), "must be a string")),
        None => return Err(TokenizeError::invalid(field("role"), "is required")),
    };
    let is_system = role == "system";
    let content = match message.get("content") {
        None => Cow::Owned(Json::String(String::new())),
        Some(Json::Null) if may_have_null_content(role, message) => {
            Cow::Owned(Json::String(String::new()))
        }
        Some(Json::Null) => {
            return Err(TokenizeError::invalid(
                field("content"),
                format!("must not be null in a `{role}` message (only assistant messages may have null content)"),
            ))
        }
        Some(Json::String(text)) if is_system && text.starts_with(CLAUDE_CODE_BILLING_HEADER) => {
            Cow::Owned(Json::String(without_billing_header(text).to_owned()))
        }
        Some(text @ Json::String(_)) => Cow::Borrowed(text),
        Some(Json::Array(parts)) => {
            let text = flatten_parts(parts, &field("content"), is_system)?;
            require_a_typed_part(role, parts, &field("content"))?;
            Cow::Owned(Json::String(text))
        }
        Some(_) => {
            return Err(TokenizeError::invalid(
                field("content"),
                "must be a string or an array of parts",
            ))
        }
    };
    let mut entries: MessageEntries<'_> = vec![
        (
            Arc::from("role"),
            Some(Cow::Owned(Json::String(role.into()))),
        ),
        (Arc::from("content"), Some(content)),
    ];
    if role == "assistant" {
        match message.get("tool_calls") {
            None | Some(Json::Null) => {}
            Some(Json::Array(calls)) if calls.is_empty() => {}
            Some(Json::Array(calls)) => {
                let calls = calls
                    .iter()
                    .enumerate()
                    .map(|(j, call)| {
                        prepare_tool_call(call, &format!("messages[{i}].tool_calls[{j}]"))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                entries.push((
                    Arc::from("tool_calls"),
                    Some(Cow::Owned(Json::Array(calls))),
                ));
            }
            Some(_) => {
                return Err(TokenizeError::invalid(
                    field("tool_calls"),
                    "must be an array",
                ))
            }
        }
        // vLLM renames the deprecated `reasoning_content` to `reasoning` when that is unset
        // (`_normalize_messages_before`): agents that send their thinking back under the old
        // name get it rendered, and their next turn's prompt holds it.
        let reasoning = ["reasoning", "reasoning_content"]
            .iter()
            .find_map(|key| message.get(*key).filter(|r| !r.is_null()));
        if let Some(reasoning) = reasoning {
            entries.push((Arc::from("reasoning"), Some(Cow::Borrowed(reasoning))));
            entries.push((
                Arc::from("reasoning_content"),
                Some(Cow::Borrowed(reasoning)),
            ));
        }
    }
    if role == "tool" {
        if let Some(id) = message.get("tool_call_id") {
            entries.push((Arc::from("tool_call_id"), Some(Cow::Borrowed(id))));
        }
    }
    for key in ["name", "task"] {
        if let Some(value @ Json::String(_)) = message.get(key) {
            entries.push((Arc::from(key), Some(Cow::Borrowed(value))));
        }
    }
    if role == "developer" {
        entries.push((Arc::from("tools"), message.get("tools").map(Cow::Borrowed)));
    }
    Ok(entries)
}

/// The texts of a content-part list joined with "\n" (vLLM's "string" content format). In a
/// system message (`strip_billing_header`) a `text` part or bare string that starts with
/// Claude Code's billing header loses its first line (see [`without_billing_header`]).
pub(crate) fn flatten_parts(
    parts: &[Json],
    field: &str,
    strip_billing_header: bool,
) -> Result<String, TokenizeError> {
    let mut texts: Vec<&str> = Vec::with_capacity(parts.len());
    for (j, part) in parts.iter().enumerate() {
        let part_field = || format!("{field}[{j}]");
        let (text, is_plain_text) = match part {
            Json::String(s) => (Some(s.as_str()), true),
            Json::Object(part) => {
                let (key, is_plain_text) = match part.get("type") {
                    Some(Json::String(t)) => match t.as_str() {
                        "text" => ("text", true),
                        "input_text" | "output_text" => ("text", false),
                        "refusal" => ("refusal", false),
                        "thinking" => ("thinking", false),
                        "tool_reference" => ("name", false),
                        "image_url" | "input_image" | "image_pil" | "image_embeds" | "audio_url"
                        | "input_audio" | "audio_embeds" | "video_url" | "prompt_embeds" => {
                            return Err(TokenizeError::invalid(
                                part_field(),
                                format!("content part type `{t}` needs a multimodal model; this tokenizer is text-only"),
                            ))
                        }
                        other => {
                            return Err(TokenizeError::invalid(
                                format!("{}.type", part_field()),
                                format!("unsupported content part type `{other}`"),
                            ))
                        }
                    },
                    Some(_) => return Err(TokenizeError::invalid(format!("{}.type", part_field()), "must be a string")),
                    None => return Err(TokenizeError::invalid(format!("{}.type", part_field()), "is required")),
                };
                let text = match part.get(key) {
                    None | Some(Json::Null) => None,
                    Some(Json::String(s)) => Some(s.as_str()),
                    Some(_) => {
                        return Err(TokenizeError::invalid(
                            format!("{}.{key}", part_field()),
                            "must be a string",
                        ))
                    }
                };
                (text, is_plain_text)
            }
            _ => {
                return Err(TokenizeError::invalid(
                    part_field(),
                    "must be an object or a string",
                ))
            }
        };
        let text = match text {
            Some(text) if strip_billing_header && is_plain_text => {
                Some(without_billing_header(text))
            }
            other => other,
        };
        // vLLM skips parts that parse to nothing, empty strings included.
        if let Some(text) = text.filter(|t| !t.is_empty()) {
            texts.push(text);
        }
    }
    Ok(texts.join("\n"))
}

/// Claude Code starts its system prompt with this line; its `cch` value changes on every
/// request, so vLLM (`_strip_claude_code_billing_header`) drops the line to keep the prompt
/// cacheable.
const CLAUDE_CODE_BILLING_HEADER: &str = "x-anthropic-billing-header";

/// A system text without its first line when it starts with Claude Code's billing header
/// (nothing is left if that is its only line); any other text as it is.
fn without_billing_header(text: &str) -> &str {
    if !text.starts_with(CLAUDE_CODE_BILLING_HEADER) {
        return text;
    }
    text.split_once('\n').map_or("", |(_, rest)| rest)
}

/// Whether a message may say `"content": null`. vLLM validates each message against the
/// OpenAI message types and its own catch-all type, and only the assistant type (and the
/// legacy `function` one, which needs a `name`) lets content be null: for any other role it
/// answers 400. A missing `content` is accepted for every role.
fn may_have_null_content(role: &str, message: &Map<String, Json>) -> bool {
    match role {
        "assistant" => true,
        "function" => message.get("name").is_some_and(Json::is_string),
        _ => false,
    }
}

/// Roles that have an OpenAI message type of their own, with typed content parts.
const OPENAI_ROLES: [&str; 5] = ["user", "system", "developer", "assistant", "tool"];

/// Refuses what vLLM 0.32 refuses: a content list of an OpenAI role made only of parts that
/// its OpenAI type does not know and that its catch-all type matches only loosely
/// (`input_text`/`output_text` parts, bare strings, `text` parts without a string `text`).
/// pydantic's union then keeps the OpenAI type, whose parts fail validation. One fully typed
/// part (`text`, `refusal`, `thinking`, ...) makes the catch-all type win and the whole list
/// pass, so only lists of loose parts alone are refused; other roles always pass.
fn require_a_typed_part(role: &str, parts: &[Json], field: &str) -> Result<(), TokenizeError> {
    if !OPENAI_ROLES.contains(&role) || parts.is_empty() || !parts.iter().all(is_loose_part) {
        return Ok(());
    }
    Err(TokenizeError::invalid(
        field,
        format!(
            "a `{role}` message's content parts must include one of type `text` (with a string \
             `text`), `refusal`, `thinking` or `tool_reference`: vLLM refuses a list made only of \
             `input_text`/`output_text` parts, bare strings and text parts without text"
        ),
    ))
}

/// A part only vLLM's catch-all message type accepts, and only loosely (see
/// [`require_a_typed_part`]).
fn is_loose_part(part: &Json) -> bool {
    match part {
        Json::String(_) => true,
        Json::Object(part) => match part.get("type").and_then(Json::as_str) {
            Some("input_text" | "output_text") => true,
            Some("text") => !part.get("text").is_some_and(Json::is_string),
            _ => false,
        },
        _ => false,
    }
}

/// A tool call with its string `arguments` parsed into a JSON object (vLLM's
/// `_postprocess_messages`).
pub(crate) fn prepare_tool_call(call: &Json, field: &str) -> Result<Json, TokenizeError> {
    let mut call = call
        .as_object()
        .cloned()
        .ok_or_else(|| TokenizeError::invalid(field, "must be an object"))?;
    let function = match call.get_mut("function") {
        Some(Json::Object(function)) => function,
        _ => {
            return Err(TokenizeError::invalid(
                format!("{field}.function"),
                "must be an object",
            ))
        }
    };
    let arguments = match function.get("arguments") {
        Some(Json::String(text)) => arguments_object(text),
        _ => {
            // OpenAI's tool-call type, which vLLM validates against, holds them as a string.
            return Err(TokenizeError::invalid(
                format!("{field}.function.arguments"),
                "must be a string (the arguments as JSON text)",
            ));
        }
    };
    function.insert("arguments".into(), arguments);
    Ok(Json::Object(call))
}

/// Tool-call arguments as chat templates get them: the JSON object the text holds, or `{}` for
/// anything else (invalid JSON, an empty text, an array, a number, a string, `null`), as vLLM
/// coerces them: templates expect a mapping.
fn arguments_object(text: &str) -> Json {
    match serde_json::from_str::<Json>(text) {
        Ok(object @ Json::Object(_)) => object,
        _ => Json::Object(Map::new()),
    }
}

/// The template value of a message: `None`s dropped, reasoning aliased (transformers 5).
pub(crate) fn message_value(entries: MessageEntries<'_>) -> Value {
    // Each value converted once; the aliases share it (template values are immutable).
    let entries: Vec<(Arc<str>, Value)> = entries
        .into_iter()
        .filter_map(|(k, v)| Some((k, json_to_value(v.as_deref()?))))
        .collect();
    let reasoning = ["reasoning_content", "thinking", "reasoning"]
        .iter()
        .find_map(|name| {
            entries
                .iter()
                .find(|(k, _)| &**k == *name)
                .map(|(_, v)| v.clone())
        });
    let mut map = OrderedMap::default();
    if let Some(reasoning) = &reasoning {
        map.insert(Arc::from("thinking"), reasoning.clone());
    }
    for (key, value) in entries {
        map.insert(key, value);
    }
    if let Some(reasoning) = reasoning {
        map.insert(Arc::from("reasoning_content"), reasoning);
    }
    map.into_value()
}

/// A tool as vLLM's `ChatCompletionToolsParam` serializes it: its declared fields only, in
/// declaration order. `{"type": "function", "function": {"name", "description",
/// "parameters", "strict"?, "defer_loading"?}, "defer_loading"?}`: a missing description or
/// parameters is `null`, `strict` and `defer_loading` are left out when unset, a tool-level
/// `defer_loading` also fills the function's when that is unset, and any other key the client
/// sent, at either level, is dropped.
pub(crate) fn tool_value(i: usize, tool: &Json) -> Result<Value, TokenizeError> {
    let field = format!("tools[{i}]");
    let tool = tool
        .as_object()
        .ok_or_else(|| TokenizeError::invalid(&field, "must be an object"))?;
    match tool.get("type") {
        None => {}
        Some(Json::String(t)) if t == "function" => {}
        Some(_) => {
            return Err(TokenizeError::invalid(
                format!("{field}.type"),
                "must be \"function\"",
            ))
        }
    }
    let function = match tool.get("function") {
        Some(Json::Object(function)) => function,
        _ => {
            return Err(TokenizeError::invalid(
                format!("{field}.function"),
                "must be an object",
            ))
        }
    };
    let function_field = format!("{field}.function");
    let name = match function.get("name") {
        Some(Json::String(name)) => name,
        _ => {
            return Err(TokenizeError::invalid(
                format!("{function_field}.name"),
                "must be a string",
            ))
        }
    };
    let optional = |key: &str, ok: fn(&Json) -> bool, what: &str| match function.get(key) {
        None => Ok(Value::from(())),
        Some(v) if v.is_null() || ok(v) => Ok(json_to_value(v)),
        Some(_) => Err(TokenizeError::invalid(
            format!("{function_field}.{key}"),
            format!("must be {what} or null"),
        )),
    };
    let tool_defer_loading = optional_bool(tool, "defer_loading", &field)?;
    let strict = optional_bool(function, "strict", &function_field)?;
    let defer_loading =
        optional_bool(function, "defer_loading", &function_field)?.or(tool_defer_loading);

    let mut dumped_function = OrderedMap::default();
    dumped_function.insert(Arc::from("name"), Value::from(name.as_str()));
    dumped_function.insert(
        Arc::from("description"),
        optional("description", Json::is_string, "a string")?,
    );
    dumped_function.insert(
        Arc::from("parameters"),
        optional("parameters", Json::is_object, "an object")?,
    );
    if let Some(strict) = strict {
        dumped_function.insert(Arc::from("strict"), Value::from(strict));
    }
    if let Some(defer_loading) = defer_loading {
        dumped_function.insert(Arc::from("defer_loading"), Value::from(defer_loading));
    }
    let mut dumped = OrderedMap::default();
    dumped.insert(Arc::from("type"), Value::from("function"));
    dumped.insert(Arc::from("function"), dumped_function.into_value());
    if let Some(defer_loading) = tool_defer_loading {
        dumped.insert(Arc::from("defer_loading"), Value::from(defer_loading));
    }
    Ok(dumped.into_value())
}

/// An optional boolean of a tool, read as pydantic's lax mode reads it; `None` if missing or
/// null.
fn optional_bool(
    object: &Map<String, Json>,
    key: &str,
    field: &str,
) -> Result<Option<bool>, TokenizeError> {
    match object.get(key) {
        None | Some(Json::Null) => Ok(None),
        Some(value) => crate::openai::lax_bool_value(value)
            .map(Some)
            .ok_or_else(|| {
                TokenizeError::invalid(format!("{field}.{key}"), "must be a boolean or null")
            }),
    }
}
