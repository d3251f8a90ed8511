//! Exactness against a real vLLM 0.32: `fixtures/vllm032_chat.json` holds requests with the
//! prompt text and token ids vLLM's OpenAI server returned for them (see its `note`), and the
//! requests its validation refused. Unlike `qwen3_tokenize.json`, whose expected values come
//! from a restatement of vLLM's preprocessing, these are vLLM's own answers, so they catch
//! rules the restatement missed. The tests are split by rule so a failure names the rule.
#![cfg(feature = "tokenizer")]

use std::sync::OnceLock;

use serde_json::{json, Value};
use switchyard_protocol::route::ApiKind;
use switchyard_protocol::tokenize::{default_model_dir, ModelTokenizer, TokenizeError};

const FIXTURE: &str = include_str!("../fixtures/vllm032_chat.json");

fn fixture() -> &'static Value {
    static FIXTURE_JSON: OnceLock<Value> = OnceLock::new();
    FIXTURE_JSON.get_or_init(|| serde_json::from_str(FIXTURE).expect("fixture is JSON"))
}

fn qwen() -> &'static ModelTokenizer {
    static TOKENIZER: OnceLock<ModelTokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let dir = default_model_dir();
        assert!(
            dir.join("tokenizer.json").is_file(),
            "Qwen3 model files missing in {}: run scripts/setup.sh (or set SWITCHYARD_MODEL_DIR)",
            dir.display()
        );
        ModelTokenizer::from_dir(&dir).expect("load model dir")
    })
}

fn cases(section: &str) -> &'static [Value] {
    fixture()[section].as_array().expect("fixture section")
}

fn case(section: &str, name: &str) -> &'static Value {
    cases(section)
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no {section} case `{name}` in the fixture"))
}

/// The case's body renders to vLLM's prompt text and tokenizes to vLLM's ids.
fn assert_matches_vllm(case: &Value) {
    let tok = qwen();
    let name = case["name"].as_str().unwrap();
    let body = &case["body"];
    let rendered = tok
        .render_chat(body)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(
        rendered,
        case["rendered"].as_str().unwrap(),
        "{name}: rendered prompt differs from vLLM's"
    );
    let want: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
    let got = tok
        .tokenize_request(ApiKind::Chat, body)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(got, want, "{name}: token ids differ from vLLM's");
}

fn assert_chat_cases_match_vllm(names: &[&str]) {
    for name in names {
        assert_matches_vllm(case("chat", name));
    }
}

/// The field of the `InvalidRequest` the body gets.
fn refused_field(body: &Value) -> String {
    match qwen().tokenize_request(ApiKind::Chat, body) {
        Err(TokenizeError::InvalidRequest { field, .. }) => field,
        other => panic!("expected InvalidRequest, got {other:?}"),
    }
}

#[test]
fn every_recorded_chat_request_matches_vllm() {
    let chats = cases("chat");
    assert!(chats.len() >= 80, "fixture lost cases");
    for case in chats {
        assert_matches_vllm(case);
    }
}

#[test]
fn developer_messages_become_one_leading_system_message() {
    // Qwen3's template never names the developer role, so vLLM makes developer messages
    // system messages and merges all system messages into the first place.
    assert_chat_cases_match_vllm(&[
        "developer_first",
        "system_then_developer",
        "user_then_developer",
        "sys_user_dev_user",
        "developer_empty",
        "developer_parts",
        "developer_with_tools+tcnone",
    ]);
}

/// vLLM renames an assistant's `reasoning_content` to `reasoning` when that is unset, so the
/// template renders it: an agent echoing its thinking under the old name had every turn's
/// prompt diverge from vLLM's at its first assistant message (no cache hit past it).
#[test]
fn reasoning_content_is_the_old_name_of_reasoning() {
    assert_chat_cases_match_vllm(&[
        "reasoning_content_last_assistant",
        "reasoning_content_null_reasoning",
        "reasoning_over_reasoning_content",
        "agent_reasoning_content_tool_loop+tcnone",
    ]);
}

#[test]
fn request_fields_win_over_chat_template_kwargs() {
    assert_chat_cases_match_vllm(&["ctk_agp_false", "agp_false_ctk_true", "continue_final_ctk"]);
}

#[test]
fn reasoning_effort_sets_enable_thinking_unless_the_kwargs_do() {
    assert_chat_cases_match_vllm(&[
        "reasoning_effort_none",
        "reasoning_effort_none_other_ctk",
        "reasoning_effort_low",
        "reasoning_effort_none_ctk_true",
    ]);
}

#[test]
fn claude_code_billing_header_line_is_dropped_from_system_messages() {
    assert_chat_cases_match_vllm(&[
        "claude_billing_header_str",
        "claude_billing_header_parts",
        "billing_header_only",
        "billing_header_not_first_part",
    ]);
    // Only system messages: a user message keeps the line.
    let header = "x-anthropic-billing-header: cch=1;\nhello";
    let rendered = qwen()
        .render_chat(&json!({"messages": [{"role": "user", "content": header}]}))
        .unwrap();
    assert!(rendered.contains(header), "{rendered}");
}

#[test]
fn tools_keep_only_their_declared_fields() {
    assert_chat_cases_match_vllm(&[
        "tools_fn_extra_key+tcnone",
        "tools_tool_extra_key+tcnone",
        "tools_defer_loading+tcnone",
        "tool_strict_null",
    ]);
    // Declared order whatever the client's; `strict` read as pydantic's lax bool.
    let tool = json!({"defer_loading": false, "x": 1, "function": {
        "strict": "yes", "parameters": {"type": "object"}, "name": "f", "y": 2}});
    let rendered = qwen()
        .render_chat(&json!({"messages": [{"role": "user", "content": "a"}], "tools": [tool]}))
        .unwrap();
    let dumped = r#"{"type": "function", "function": {"name": "f", "description": null, "parameters": {"type": "object"}, "strict": true, "defer_loading": false}, "defer_loading": false}"#;
    assert!(rendered.contains(dumped), "{rendered}");
}

#[test]
fn tool_call_arguments_that_are_not_an_object_become_empty() {
    assert_chat_cases_match_vllm(&[
        "args_array_string+tcnone",
        "args_number_string+tcnone",
        "args_null_string+tcnone",
        "args_string_string+tcnone",
    ]);
}

#[test]
fn requests_vllm_refuses_are_client_errors() {
    let refused = cases("refused");
    assert!(refused.len() >= 10, "fixture lost cases");
    for case in refused {
        let name = case["name"].as_str().unwrap();
        let err = qwen()
            .tokenize_request(ApiKind::Chat, &case["body"])
            .expect_err(name);
        assert!(err.is_client_error(), "{name}: {err}");
    }
    let field = |name: &str| refused_field(&case("refused", name)["body"]);
    assert_eq!(field("tools_empty_list"), "tools");
    assert_eq!(field("content_null_user"), "messages[0].content");
    assert_eq!(field("parts_input_text"), "messages[0].content");
    assert_eq!(
        field("args_dict_value"),
        "messages[1].tool_calls[0].function.arguments"
    );
    assert_eq!(
        field("args_array_value"),
        "messages[1].tool_calls[0].function.arguments"
    );
}

#[test]
fn null_content_is_refused_except_for_assistants() {
    // What vLLM 0.32's request validation answers (checked against its pydantic model).
    let chat = |message: Value| json!({"messages": [message]});
    for role in ["user", "system", "developer", "tool", "custom_role"] {
        assert_eq!(
            refused_field(&chat(json!({"role": role, "content": null}))),
            "messages[0].content",
            "{role}"
        );
    }
    let accepted = [
        json!({"role": "assistant", "content": null}),
        json!({"role": "function", "name": "f", "content": null}),
        json!({"role": "user"}),
    ];
    for message in accepted {
        qwen()
            .render_chat(&chat(message.clone()))
            .unwrap_or_else(|e| panic!("{message}: {e}"));
    }
}

#[test]
fn content_lists_of_loose_parts_alone_are_refused_for_openai_roles() {
    let text = json!({"type": "text", "text": "t"});
    let input_text = json!({"type": "input_text", "text": "i"});
    let output_text = json!({"type": "output_text", "text": "o"});
    let text_null = json!({"type": "text", "text": null});
    let refusal = json!({"type": "refusal", "refusal": "r"});
    let chat = |role: &str, parts: Vec<&Value>| json!({"messages": [{"role": role, "content": parts}], "add_generation_prompt": false});
    for parts in [
        vec![&input_text],
        vec![&input_text, &output_text],
        vec![&input_text, &json!("bare")],
        vec![&text_null, &json!("bare")],
    ] {
        for role in ["user", "system", "developer", "assistant", "tool"] {
            assert_eq!(
                refused_field(&chat(role, parts.clone())),
                "messages[0].content",
                "{role} {parts:?}"
            );
        }
    }
    // One typed part makes vLLM accept the list, loose parts included; other roles take any.
    let rendered = qwen()
        .render_chat(&chat("user", vec![&input_text, &text]))
        .unwrap();
    assert_eq!(rendered, "<|im_start|>user\ni\nt<|im_end|>\n");
    let rendered = qwen()
        .render_chat(&chat("assistant", vec![&output_text, &refusal]))
        .unwrap();
    assert_eq!(rendered, "<|im_start|>assistant\no\nr<|im_end|>\n");
    qwen()
        .render_chat(&chat("function", vec![&input_text]))
        .unwrap();
}

#[test]
fn tool_call_arguments_must_be_a_string() {
    for arguments in [json!({"a": 1}), json!([1]), json!(null), json!(3)] {
        let call = json!({"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}});
        let body = json!({"messages": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": null, "tool_calls": [call]},
        ]});
        assert_eq!(
            refused_field(&body),
            "messages[1].tool_calls[0].function.arguments",
            "{arguments}"
        );
    }
}

#[test]
fn reasoning_effort_takes_vllms_values_only() {
    let body = |effort: Value| json!({"messages": [{"role": "user", "content": "a"}], "reasoning_effort": effort});
    assert_eq!(refused_field(&body(json!("extreme"))), "reasoning_effort");
    assert_eq!(refused_field(&body(json!(1))), "reasoning_effort");
    let plain = qwen().render_chat(&body(json!(null))).unwrap();
    assert_eq!(plain, qwen().render_chat(&body(json!("high"))).unwrap());
}

#[test]
fn recorded_completions_match_vllm() {
    let tok = qwen();
    for case in cases("completions") {
        let name = case["name"].as_str().unwrap();
        let want: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
        let got = tok
            .tokenize_request(ApiKind::Completions, &case["body"])
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got, want, "{name}");
        let later: Vec<usize> = serde_json::from_value(case["later_lengths"].clone()).unwrap();
        assert_eq!(
            tok.later_completion_prompt_lengths(&case["body"]).unwrap(),
            later,
            "{name}"
        );
    }
}

/// The prompts a case sends: a completions batch (of texts or of token-id lists) as its
/// prompts one by one (each is served as a request of its own), anything else whole.
fn prompts_of(api: ApiKind, body: &Value) -> Vec<Value> {
    let one = |prompt: Value| {
        let mut one = body.clone();
        one["prompt"] = prompt;
        one
    };
    match (api, body["prompt"].as_array()) {
        (ApiKind::Completions, Some(items)) if items.iter().all(Value::is_string) => {
            items.iter().map(|text| one(text.clone())).collect()
        }
        // A batch of one id list: alone, `["33"]` would be a text.
        (ApiKind::Completions, Some(items)) if items.iter().all(Value::is_array) => {
            items.iter().map(|ids| one(json!([ids]))).collect()
        }
        _ => vec![body.clone()],
    }
}

/// `truncate_prompt_tokens` (and lax token ids): every case vLLM served is served here with
/// the ids it kept, the prompt tokenized whole and then cut as `generation_params` reads the
/// request; every case it refused is refused, by the request check or the prompt length.
#[test]
fn truncated_prompts_keep_the_tokens_vllm_keeps() {
    use switchyard_protocol::openai::{check_prompt_length, generation_params};
    // The recording server's --max-model-len.
    const CONTEXT: u32 = 16384;
    let truncated = cases("truncated");
    assert!(truncated.len() >= 20, "fixture lost cases");
    for case in truncated {
        let name = case["name"].as_str().unwrap();
        let api = match case["api"].as_str().unwrap() {
            "chat" => ApiKind::Chat,
            _ => ApiKind::Completions,
        };
        let mut body = case["body"].clone();
        if let Some(long) = case.get("long_user_message") {
            let text = long["text"].as_str().unwrap();
            let times = long["times"].as_u64().unwrap() as usize;
            body["messages"] = json!([{"role": "user", "content": text.repeat(times)}]);
        }
        if let Some(max_tokens) = case.get("max_tokens") {
            body["max_tokens"] = max_tokens.clone();
        }
        let served =
            generation_params(api, body.as_object().unwrap(), CONTEXT).and_then(|params| {
                prompts_of(api, &body)
                    .iter()
                    .map(|prompt| {
                        let mut ids = qwen()
                            .tokenize_request(api, prompt)
                            .unwrap_or_else(|e| panic!("{name}: {e}"));
                        if let Some(truncation) = params.truncation {
                            truncation.apply(&mut ids);
                        }
                        check_prompt_length(ids.len(), CONTEXT).map(|()| ids)
                    })
                    .collect::<Result<Vec<_>, _>>()
            });
        if case.get("status").is_some() {
            assert!(served.is_err(), "{name}: vLLM refused it, here {served:?}");
            continue;
        }
        let served = served.unwrap_or_else(|e| panic!("{name}: vLLM served it, here {e}"));
        if let Some(want) = case.get("ids") {
            let want: Vec<Vec<u32>> = serde_json::from_value(want.clone()).unwrap();
            assert_eq!(served, want, "{name}");
        } else {
            let lens: Vec<usize> = serde_json::from_value(case["ids_len"].clone()).unwrap();
            let heads: Vec<Vec<u32>> = serde_json::from_value(case["ids_head"].clone()).unwrap();
            let tails: Vec<Vec<u32>> = serde_json::from_value(case["ids_tail"].clone()).unwrap();
            for (j, ids) in served.iter().enumerate() {
                assert_eq!(ids.len(), lens[j], "{name}");
                assert_eq!(ids[..16], heads[j][..], "{name}");
                assert_eq!(ids[ids.len() - 16..], tails[j][..], "{name}");
            }
        }
    }
}
