//! A completions body's `prompt` -> what to tokenize.
//!
//! OpenAI (and vLLM) accept `prompt` as a string, a list of strings, a token-id list, or a list
//! of token-id lists; a list is a batch that vLLM serves as separate requests. A route verdict
//! is for one request, so Switchyard routes a batch by its **first** prompt (the others are
//! still validated, so a malformed batch is a 400 here as it would be at vLLM).

use serde_json::Value as Json;

use super::chat_request::bool_field;
use super::error::TokenizeError;

/// What a completions prompt asks to tokenize.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum CompletionPrompt<'a> {
    /// Text, tokenized with the body's `add_special_tokens` (default true).
    Text {
        text: &'a str,
        add_special_tokens: bool,
    },
    /// Token ids, used as given.
    Tokens(Vec<u32>),
}

/// Extracts the (first) prompt of a completions body.
pub(crate) fn prepare_completion(body: &Json) -> Result<CompletionPrompt<'_>, TokenizeError> {
    let body = body
        .as_object()
        .ok_or_else(|| TokenizeError::invalid("body", "must be a JSON object"))?;
    let add_special_tokens = bool_field(body, "add_special_tokens", true)?;
    let prompt = match body.get("prompt") {
        None | Some(Json::Null) => return Err(TokenizeError::invalid("prompt", "is required")),
        Some(prompt) => prompt,
    };
    let items = match prompt {
        Json::String(text) => return Ok(CompletionPrompt::Text { text, add_special_tokens }),
        Json::Array(items) if items.is_empty() => return Err(TokenizeError::invalid("prompt", "must not be empty")),
        Json::Array(items) => items,
        _ => {
            return Err(TokenizeError::invalid(
                "prompt",
                "must be a string, an array of strings, an array of token ids or an array of token-id arrays",
            ))
        }
    };
    match &items[0] {
        Json::String(first) => {
            if let Some(j) = items.iter().position(|p| !p.is_string()) {
                return Err(TokenizeError::invalid(
                    format!("prompt[{j}]"),
                    "must be a string like prompt[0]",
                ));
            }
            Ok(CompletionPrompt::Text {
                text: first,
                add_special_tokens,
            })
        }
        Json::Number(_) => Ok(CompletionPrompt::Tokens(token_ids(items, "prompt")?)),
        Json::Array(first) => {
            for (j, item) in items.iter().enumerate().skip(1) {
                match item {
                    Json::Array(ids) => {
                        token_ids(ids, &format!("prompt[{j}]"))?;
                    }
                    _ => {
                        return Err(TokenizeError::invalid(
                            format!("prompt[{j}]"),
                            "must be a token-id array like prompt[0]",
                        ))
                    }
                }
            }
            if first.is_empty() {
                return Err(TokenizeError::invalid("prompt[0]", "must not be empty"));
            }
            Ok(CompletionPrompt::Tokens(token_ids(first, "prompt[0]")?))
        }
        _ => Err(TokenizeError::invalid(
            "prompt[0]",
            "must be a string, a token id or a token-id array",
        )),
    }
}

fn token_ids(items: &[Json], field: &str) -> Result<Vec<u32>, TokenizeError> {
    items
        .iter()
        .enumerate()
        .map(|(j, id)| {
            id.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| {
                    TokenizeError::invalid(
                        format!("{field}[{j}]"),
                        "must be a token id (an integer in 0..2^32)",
                    )
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn routes_a_batch_by_its_first_prompt() {
        let body = json!({"prompt": ["first", "second"], "add_special_tokens": false});
        assert_eq!(
            prepare_completion(&body).unwrap(),
            CompletionPrompt::Text {
                text: "first",
                add_special_tokens: false
            }
        );
        let body = json!({"prompt": [[1, 2], [3]]});
        assert_eq!(
            prepare_completion(&body).unwrap(),
            CompletionPrompt::Tokens(vec![1, 2])
        );
        assert_eq!(
            prepare_completion(&json!({"prompt": [7, 8]})).unwrap(),
            CompletionPrompt::Tokens(vec![7, 8])
        );
    }

    #[test]
    fn names_the_offending_field() {
        let field_of = |body: Json| match prepare_completion(&body) {
            Err(TokenizeError::InvalidRequest { field, .. }) => field,
            other => panic!("expected InvalidRequest, got {other:?}"),
        };
        assert_eq!(field_of(json!({})), "prompt");
        assert_eq!(field_of(json!({"prompt": 3})), "prompt");
        assert_eq!(field_of(json!({"prompt": []})), "prompt");
        assert_eq!(field_of(json!({"prompt": ["a", 1]})), "prompt[1]");
        assert_eq!(field_of(json!({"prompt": [1, -1]})), "prompt[1]");
        assert_eq!(
            field_of(json!({"prompt": [[1], [4294967296u64]]})),
            "prompt[1][0]"
        );
        assert_eq!(
            field_of(json!({"prompt": "x", "add_special_tokens": "maybe"})),
            "add_special_tokens"
        );
        assert_eq!(
            field_of(json!({"prompt": "x", "add_special_tokens": 2})),
            "add_special_tokens"
        );
    }

    #[test]
    fn add_special_tokens_is_read_as_vllms_lax_booleans() {
        for (given, read) in [
            (json!("yes"), true),
            (json!(0), false),
            (json!("off"), false),
            (json!("TRUE"), true),
        ] {
            let body = json!({"prompt": "x", "add_special_tokens": given});
            assert_eq!(
                prepare_completion(&body).unwrap(),
                CompletionPrompt::Text {
                    text: "x",
                    add_special_tokens: read
                },
                "{given}"
            );
        }
    }
}
