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
    let content = match message.get("content") {
        None | Some(Json::Null) => Cow::Owned(Json::String(String::new())),
        Some(text @ Json::String(_)) => Cow::Borrowed(text),
        Some(Json::Array(parts)) => {
            Cow::Owned(Json::String(flatten_parts(parts, &field("content"))?))
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
        if let Some(reasoning) = message.get("reasoning").filter(|r| !r.is_null()) {
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

/// The texts of a content-part list joined with "\n" (vLLM's "string" content format).
pub(crate) fn flatten_parts(parts: &[Json], field: &str) -> Result<String, TokenizeError> {
    let mut texts: Vec<&str> = Vec::with_capacity(parts.len());
    for (j, part) in parts.iter().enumerate() {
        let part_field = || format!("{field}[{j}]");
        let text = match part {
            Json::String(s) => Some(s.as_str()),
            Json::Object(part) => {
                let key = match part.get("type") {
                    Some(Json::String(t)) => match t.as_str() {
                        "text" | "input_text" | "output_text" => "text",
                        "refusal" => "refusal",
                        "thinking" => "thinking",
                        "tool_reference" => "name",
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
                match part.get(key) {
                    None | Some(Json::Null) => None,
                    Some(Json::String(s)) => Some(s.as_str()),
                    Some(_) => {
                        return Err(TokenizeError::invalid(
                            format!("{}.{key}", part_field()),
                            "must be a string",
                        ))
                    }
                }
            }
            _ => {
                return Err(TokenizeError::invalid(
                    part_field(),
                    "must be an object or a string",
                ))
            }
        };
        // vLLM skips parts that parse to nothing, empty strings included.
        if let Some(text) = text.filter(|t| !t.is_empty()) {
            texts.push(text);
        }
    }
    Ok(texts.join("\n"))
}

/// A tool call with string `arguments` parsed into JSON (vLLM's `_postprocess_messages`).
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
        Some(Json::String(s)) => {
            serde_json::from_str::<Json>(s).unwrap_or_else(|_| Json::Object(Map::new()))
        }
        Some(v @ (Json::Object(_) | Json::Array(_))) => v.clone(),
        _ => Json::Object(Map::new()),
    };
    function.insert("arguments".into(), arguments);
    Ok(Json::Object(call))
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

/// A tool as vLLM's pydantic `ChatCompletionToolsParam.model_dump()` writes it.
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
    let name = match function.get("name") {
        Some(Json::String(name)) => name,
        _ => {
            return Err(TokenizeError::invalid(
                format!("{field}.function.name"),
                "must be a string",
            ))
        }
    };
    let optional = |key: &str, ok: fn(&Json) -> bool, what: &str| match function.get(key) {
        None => Ok(Value::from(())),
        Some(v) if v.is_null() || ok(v) => Ok(json_to_value(v)),
        Some(_) => Err(TokenizeError::invalid(
            format!("{field}.function.{key}"),
            format!("must be {what} or null"),
        )),
    };
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
    for (key, value) in function
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "name" | "description" | "parameters"))
    {
        dumped_function.insert(Arc::from(key.as_str()), json_to_value(value));
    }
    let mut dumped = OrderedMap::default();
    dumped.insert(Arc::from("type"), Value::from("function"));
    dumped.insert(Arc::from("function"), dumped_function.into_value());
    for (key, value) in tool
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "type" | "function"))
    {
        dumped.insert(Arc::from(key.as_str()), json_to_value(value));
    }
    Ok(dumped.into_value())
}
