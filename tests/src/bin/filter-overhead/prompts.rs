//! The prompts: chats of English-like prose sized in tokens.

use serde_json::{json, Value};
use switchyard_protocol::route::ApiKind;
use switchyard_protocol::tokenize::ModelTokenizer;

/// Messages of a conversation before its new question.
const MESSAGES: usize = 16;

/// English-like prose of about `bytes` bytes, numbered every 16 words with `salt` in each
/// number, so that texts of different salts share no stretch (and no tokenizer chunk).
pub(crate) fn prose(bytes: usize, salt: &str) -> String {
    const WORDS: [&str; 16] = [
        "the", "agent", "reads", "each", "file", "before", "it", "changes", "any", "line", "and",
        "then", "runs", "the", "tests", "again",
    ];
    let mut content = String::with_capacity(bytes + 64);
    let mut i = 0u64;
    while content.len() < bytes {
        if i.is_multiple_of(16) {
            content.push_str(&format!("step {salt}x{} ", i / 16));
        }
        content.push_str(WORDS[(i % 16) as usize]);
        content.push(' ');
        i += 1;
    }
    content
}

/// A chat of [`MESSAGES`] messages of `bytes` bytes in all (made from `salt`), then the
/// user's question number `question`.
pub(crate) fn chat_of(bytes: usize, salt: &str, question: usize) -> Value {
    let mut messages: Vec<Value> = (0..MESSAGES)
        .map(|m| {
            let role = if m % 2 == 0 { "user" } else { "assistant" };
            json!({"role": role, "content": prose(bytes / MESSAGES, &format!("{salt}m{m}"))})
        })
        .collect();
    messages.push(json!({
        "role": "user",
        "content": format!("Question {question}: which step changed the most, and why?"),
    }));
    json!({"model": "qwen3", "messages": messages, "max_tokens": 1, "stream": false})
}

/// Body bytes that make a chat of about `tokens` tokens, and its exact token count, found by
/// tokenizing one estimate with the control plane's tokenizer and scaling once.
pub(crate) fn calibrate(
    tokenizer: &ModelTokenizer,
    tokens: usize,
) -> anyhow::Result<(usize, usize)> {
    let isl = |bytes: usize| -> anyhow::Result<usize> {
        Ok(tokenizer
            .tokenize_request(ApiKind::Chat, &chat_of(bytes, "calibrate", 0))?
            .len())
    };
    let guess = tokens * 4;
    let bytes = guess * tokens / isl(guess)?.max(1);
    Ok((bytes, isl(bytes)?))
}
