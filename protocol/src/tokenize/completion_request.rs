//! A completions body's `prompt` -> what to tokenize.
//!
//! OpenAI (and vLLM) accept `prompt` as a string, a list of strings, a token-id list, or a list
//! of token-id lists; a list is a batch that vLLM serves as separate requests. A route verdict
//! is for one request, so Switchyard routes a batch by its **first** prompt; every prompt is
//! still validated (here its shape and token ids, by the caller its length), so a malformed
//! batch is a 400 here as it would be at vLLM.

use serde_json::Value as Json;

use super::chat_request::bool_field;
use super::error::TokenizeError;
use crate::openai::lax_int_value;

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

/// The first prompt of a completions body, every prompt checked as [`completion_prompts`]
/// checks them.
pub(crate) fn prepare_completion(
    body: &Json,
    max_token_id: u32,
) -> Result<CompletionPrompt<'_>, TokenizeError> {
    let mut prompts = completion_prompts(body, max_token_id)?;
    if let Some(CompletionPrompt::Tokens(first)) = prompts.first() {
        if first.is_empty() {
            return Err(TokenizeError::invalid("prompt[0]", "must not be empty"));
        }
    }
    Ok(prompts.swap_remove(0))
}

/// Every prompt of a completions body, in order (one unless it is a batch): the shape
/// checked, and every token id within the vocabulary (`0..=max_token_id`), as vLLM checks
/// them. An empty token-id list is left for the length check.
pub(crate) fn completion_prompts(
    body: &Json,
    max_token_id: u32,
) -> Result<Vec<CompletionPrompt<'_>>, TokenizeError> {
    let body = body
        .as_object()
        .ok_or_else(|| TokenizeError::invalid("body", "must be a JSON object"))?;
    let add_special_tokens = bool_field(body, "add_special_tokens", true)?;
    let text = |text| CompletionPrompt::Text {
        text,
        add_special_tokens,
    };
    let prompt = match body.get("prompt") {
        None | Some(Json::Null) => return Err(TokenizeError::invalid("prompt", "is required")),
        Some(prompt) => prompt,
    };
    let items = match prompt {
        Json::String(s) => return Ok(vec![text(s)]),
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
        Json::String(_) => match items.iter().position(|item| !item.is_string()) {
            None => Ok(items.iter().filter_map(Json::as_str).map(text).collect()),
            // Not all strings: pydantic's union then reads a token-id list, whose ids may be
            // decimal strings (`["11", 22]`).
            Some(_) if items.iter().all(|item| lax_int_value(item).is_some()) => {
                Ok(vec![CompletionPrompt::Tokens(token_ids(
                    items,
                    "prompt",
                    max_token_id,
                )?)])
            }
            Some(j) => Err(TokenizeError::invalid(
                format!("prompt[{j}]"),
                "must be a string like prompt[0]",
            )),
        },
        Json::Number(_) | Json::Bool(_) => Ok(vec![CompletionPrompt::Tokens(token_ids(
            items,
            "prompt",
            max_token_id,
        )?)]),
        Json::Array(_) => items
            .iter()
            .enumerate()
            .map(|(j, item)| match item {
                Json::Array(ids) => Ok(CompletionPrompt::Tokens(token_ids(
                    ids,
                    &format!("prompt[{j}]"),
                    max_token_id,
                )?)),
                _ => Err(TokenizeError::invalid(
                    format!("prompt[{j}]"),
                    "must be a token-id array like prompt[0]",
                )),
            })
            .collect(),
        _ => Err(TokenizeError::invalid(
            "prompt[0]",
            "must be a string, a token id or a token-id array",
        )),
    }
}

fn token_ids(items: &[Json], field: &str, max_token_id: u32) -> Result<Vec<u32>, TokenizeError> {
    items
        .iter()
        .enumerate()
        .map(|(j, id)| {
            // Read as vLLM's lax integers: `11.0`, `"11"` and `true` are ids too.
            let id = lax_int_value(id)
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| {
                    TokenizeError::invalid(
                        format!("{field}[{j}]"),
                        "must be a token id (an integer in 0..2^32)",
                    )
                })?;
            if id > max_token_id {
                return Err(TokenizeError::invalid(
                    format!("{field}[{j}]"),
                    format!("token id {id} is out of vocabulary (the largest is {max_token_id})"),
                ));
            }
            Ok(id)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A vocabulary of 1000 ids (0..=999).
    const MAX_ID: u32 = 999;

    #[test]
    fn routes_a_batch_by_its_first_prompt() {
        let body = json!({"prompt": ["first", "second"], "add_special_tokens": false});
        assert_eq!(
            prepare_completion(&body, MAX_ID).unwrap(),
            CompletionPrompt::Text {
                text: "first",
                add_special_tokens: false
            }
        );
        let body = json!({"prompt": [[1, 2], [3]]});
        assert_eq!(
            prepare_completion(&body, MAX_ID).unwrap(),
            CompletionPrompt::Tokens(vec![1, 2])
        );
        assert_eq!(
            prepare_completion(&json!({"prompt": [7, 8]}), MAX_ID).unwrap(),
            CompletionPrompt::Tokens(vec![7, 8])
        );
    }

    #[test]
    fn every_prompt_of_a_batch_is_listed() {
        let body = json!({"prompt": ["a", ""]});
        let prompts = completion_prompts(&body, MAX_ID).unwrap();
        assert_eq!(prompts.len(), 2);
        assert_eq!(
            prompts[1],
            CompletionPrompt::Text {
                text: "",
                add_special_tokens: true
            }
        );
        let body = json!({"prompt": [[1, 2], []]});
        assert_eq!(
            completion_prompts(&body, MAX_ID).unwrap(),
            vec![
                CompletionPrompt::Tokens(vec![1, 2]),
                CompletionPrompt::Tokens(vec![])
            ],
            "an empty later prompt is left for the length check"
        );
    }

    /// vLLM 0.32 reads token ids as pydantic's lax integers (recorded: `[11.0, 22.0, 33]`,
    /// `["11", 22, 33]`, `[true, 22, 33]`, `[[11.0, 22], [33]]` served with those ids), while a
    /// list of strings only is a batch of texts.
    #[test]
    fn token_ids_are_read_as_lax_integers() {
        let tokens = |prompt: Json| match prepare_completion(&json!({ "prompt": prompt }), MAX_ID) {
            Ok(CompletionPrompt::Tokens(ids)) => Ok(ids),
            Ok(text) => panic!("read as text: {text:?}"),
            Err(e) => Err(e),
        };
        assert_eq!(tokens(json!([11.0, 22.0, 33])).unwrap(), vec![11, 22, 33]);
        assert_eq!(tokens(json!(["11", 22, 33])).unwrap(), vec![11, 22, 33]);
        assert_eq!(tokens(json!([" 11", 22])).unwrap(), vec![11, 22]);
        assert_eq!(tokens(json!([true, 22, 33])).unwrap(), vec![1, 22, 33]);
        assert_eq!(tokens(json!([[11.0, 22], [33]])).unwrap(), vec![11, 22]);
        for refused in [json!([11.5, 22]), json!(["1e1", 22]), json!(["11", 1000])] {
            assert!(tokens(refused.clone()).is_err(), "{refused}");
        }
        let strings = json!({"prompt": ["11", "22"]});
        assert_eq!(
            prepare_completion(&strings, MAX_ID).unwrap(),
            CompletionPrompt::Text {
                text: "11",
                add_special_tokens: true
            }
        );
    }

    #[test]
    fn names_the_offending_field() {
        let field_of = |body: Json| match prepare_completion(&body, MAX_ID) {
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
        // Out of the vocabulary, as vLLM refuses it, wherever in the batch.
        assert_eq!(field_of(json!({"prompt": [1, 1000]})), "prompt[1]");
        assert_eq!(
            field_of(json!({"prompt": [[1], [2, 999, 1000]]})),
            "prompt[1][2]"
        );
        assert_eq!(field_of(json!({"prompt": [[]]})), "prompt[0]");
        assert_eq!(
            field_of(json!({"prompt": "x", "add_special_tokens": "maybe"})),
            "add_special_tokens"
        );
        assert_eq!(
            field_of(json!({"prompt": "x", "add_special_tokens": 2})),
            "add_special_tokens"
        );
    }

    /// vLLM 0.32's `add_special_tokens` is a plain `bool`: `null` and a padded string are
    /// refused (a differential run against a real vLLM).
    #[test]
    fn add_special_tokens_refuses_what_vllm_refuses() {
        for given in [json!(null), json!(" yes "), json!(2), json!([true])] {
            let body = json!({"prompt": "x", "add_special_tokens": given});
            assert!(prepare_completion(&body, MAX_ID).is_err(), "{given}");
        }
    }

    #[test]
    fn add_special_tokens_is_read_as_vllms_lax_booleans() {
        for (given, read) in [
            (json!("yes"), true),
            (json!(0), false),
            (json!("off"), false),
            (json!("TRUE"), true),
            (json!(1.0), true),
            (json!(-0.0), false),
        ] {
            let body = json!({"prompt": "x", "add_special_tokens": given});
            assert_eq!(
                prepare_completion(&body, MAX_ID).unwrap(),
                CompletionPrompt::Text {
                    text: "x",
                    add_special_tokens: read
                },
                "{given}"
            );
        }
    }
}
