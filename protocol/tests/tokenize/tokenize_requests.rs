//! Request handling around the tokenizer: typed errors naming the field, model-folder
//! variants (named templates, `chat_template.jinja`, a BOS-adding post-processor), the segment
//! cache's incremental behaviour, and sharing across threads.
#![cfg(feature = "tokenizer")]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{json, Value};
use switchyard_protocol::route::ApiKind;
use switchyard_protocol::tokenize::{default_model_dir, ModelTokenizer, TokenizeError};

fn qwen_dir() -> PathBuf {
    let dir = default_model_dir();
    assert!(
        dir.join("tokenizer.json").is_file(),
        "Qwen3 model files missing in {}: run scripts/setup.sh (or set SWITCHYARD_MODEL_DIR)",
        dir.display()
    );
    dir
}

fn qwen() -> ModelTokenizer {
    ModelTokenizer::from_dir(&qwen_dir()).expect("load model dir")
}

/// A scratch model folder: Qwen3's `tokenizer.json` (optionally edited) plus the given config.
fn model_dir(name: &str, config: &Value, edit_tokenizer: impl FnOnce(&mut Value)) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("tokenize-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut tokenizer: Value =
        serde_json::from_str(&std::fs::read_to_string(qwen_dir().join("tokenizer.json")).unwrap())
            .unwrap();
    edit_tokenizer(&mut tokenizer);
    std::fs::write(
        dir.join("tokenizer.json"),
        serde_json::to_vec(&tokenizer).unwrap(),
    )
    .unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        serde_json::to_vec(config).unwrap(),
    )
    .unwrap();
    dir
}

fn invalid_field(result: Result<Vec<u32>, TokenizeError>) -> String {
    match result {
        Err(TokenizeError::InvalidRequest { field, .. }) => field,
        other => panic!("expected InvalidRequest, got {other:?}"),
    }
}

#[test]
fn bad_chat_bodies_name_the_field() {
    let tok = qwen();
    let chat = |body: Value| invalid_field(tok.tokenize_request(ApiKind::Chat, &body));
    assert_eq!(chat(json!([])), "body");
    assert_eq!(chat(json!({})), "messages");
    assert_eq!(chat(json!({"messages": []})), "messages");
    assert_eq!(chat(json!({"messages": "hi"})), "messages");
    assert_eq!(chat(json!({"messages": [1]})), "messages[0]");
    assert_eq!(
        chat(json!({"messages": [{"content": "x"}]})),
        "messages[0].role"
    );
    assert_eq!(
        chat(json!({"messages": [{"role": "user", "content": 5}]})),
        "messages[0].content"
    );
    let image = json!({"type": "image_url", "image_url": {"url": "http://x/y.png"}});
    assert_eq!(
        chat(
            json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, image]}]})
        ),
        "messages[0].content[1]"
    );
    assert_eq!(
        chat(json!({"messages": [{"role": "user", "content": [{"text": "a"}]}]})),
        "messages[0].content[0].type"
    );
    let user = json!({"role": "user", "content": "hi"});
    assert_eq!(
        chat(json!({"messages": [user], "tools": {"a": 1}})),
        "tools"
    );
    assert_eq!(
        chat(json!({"messages": [user], "tools": [{"type": "function", "function": {}}]})),
        "tools[0].function.name"
    );
    assert_eq!(
        chat(json!({"messages": [user], "tools": [{"type": "custom", "function": {"name": "f"}}]})),
        "tools[0].type"
    );
    assert_eq!(
        chat(json!({"messages": [user], "add_generation_prompt": "maybe"})),
        "add_generation_prompt"
    );
    assert_eq!(
        chat(json!({"messages": [user], "continue_final_message": true})),
        "continue_final_message"
    );
    assert_eq!(
        chat(json!({"messages": [user], "chat_template": "{{ 1 }}"})),
        "chat_template"
    );
    assert_eq!(
        chat(json!({"messages": [user], "chat_template_kwargs": [1]})),
        "chat_template_kwargs"
    );
    let bad_call = json!({"role": "assistant", "content": "", "tool_calls": [{"id": "c"}]});
    assert_eq!(
        chat(json!({"messages": [user, bad_call]})),
        "messages[1].tool_calls[0].function"
    );
}

#[test]
fn bad_completions_bodies_name_the_field() {
    let tok = qwen();
    let err = tok
        .tokenize_request(ApiKind::Completions, &json!({"messages": []}))
        .unwrap_err();
    assert!(err.is_client_error());
    assert!(err.to_string().contains("`prompt`"), "{err}");
}

#[test]
fn tool_call_arguments_are_reserialised_like_python() {
    // vLLM parses string arguments into a dict; the template prints it with json.dumps, so
    // compact client JSON gains Python's separators, and invalid JSON becomes {}.
    let tok = qwen();
    let call = |args: Value| {
        json!({"messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": args}}]},
        ], "add_generation_prompt": false})
    };
    let rendered = tok
        .render_chat(&call(json!("{\"z\":1,\"a\":[true,null,1.0]}")))
        .unwrap();
    assert!(
        rendered.contains(r#"{"name": "f", "arguments": {"z": 1, "a": [true, null, 1.0]}}"#),
        "{rendered}"
    );
    let rendered = tok.render_chat(&call(json!("not json"))).unwrap();
    assert!(rendered.contains(r#""arguments": {}}"#), "{rendered}");
}

#[test]
fn a_new_turn_only_tokenizes_new_segments() {
    let tok = qwen();
    let mut messages = vec![json!({"role": "system", "content": "You are terse. ".repeat(200)})];
    for turn in 0..6 {
        messages.push(
            json!({"role": "user", "content": format!("Question {turn}: {}", "why? ".repeat(50))}),
        );
        messages.push(json!({"role": "assistant", "content": format!("Answer {turn}: {}", "because. ".repeat(50))}));
    }
    messages.push(json!({"role": "user", "content": "And finally?"}));
    let body = json!({"messages": messages});
    tok.tokenize_request(ApiKind::Chat, &body).unwrap();
    let before = tok.cache_stats();

    messages.push(json!({"role": "assistant", "content": "Finally, this."}));
    messages.push(json!({"role": "user", "content": "One more question."}));
    let body = json!({"messages": messages});
    let ids = tok.tokenize_request(ApiKind::Chat, &body).unwrap();
    let after = tok.cache_stats();

    assert_eq!(
        ids,
        tok.encode_uncached(&tok.render_chat(&body).unwrap(), false)
            .unwrap()
    );
    // New: the two new messages and the generation prompt; everything older is a hit.
    assert!(after.misses - before.misses <= 3, "{before:?} -> {after:?}");
    assert!(after.hits - before.hits >= 14, "{before:?} -> {after:?}");
    assert!(after.entries > 0 && after.bytes > 0);
}

#[test]
fn token_lookups_for_the_load_generator() {
    let tok = qwen();
    assert_eq!(tok.eos_token_id(), Some(151645));
    assert_eq!(tok.token_to_id("<|im_end|>"), Some(151645));
    let the = tok
        .token_to_id("Ġthe")
        .expect("byte-level spelling of ' the'");
    assert_eq!(tok.encode(" the").unwrap(), [the]);
    assert_eq!(tok.id_to_token(the).as_deref(), Some("Ġthe"));
    let ids = tok.encode("Grüße, 世界! <|im_end|>").unwrap();
    assert_eq!(
        ids.last(),
        Some(&151645),
        "special tokens in text are recognised"
    );
    assert_eq!(tok.decode(&ids).unwrap(), "Grüße, 世界! <|im_end|>");
    assert!(tok.vocab_size() > 151_000);
}

#[test]
fn shared_across_threads_gives_identical_ids() {
    let tok = Arc::new(qwen());
    let body = json!({"messages": [{"role": "user", "content": "Concurrency is not parallelism. ".repeat(30)}]});
    let want = tok
        .encode_uncached(&tok.render_chat(&body).unwrap(), false)
        .unwrap();
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (tok, body) = (tok.clone(), body.clone());
            std::thread::spawn(move || {
                (0..20)
                    .map(|_| tok.tokenize_request(ApiKind::Chat, &body).unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for handle in handles {
        for ids in handle.join().unwrap() {
            assert_eq!(ids, want);
        }
    }
}

#[test]
fn named_templates_object_tokens_and_jinja_file() {
    let config = json!({
        "bos_token": {"__type": "AddedToken", "content": "<|endoftext|>", "lstrip": false},
        "eos_token": "<|im_end|>",
        "chat_template": [
            {"name": "default", "template": "D:{{ bos_token }}{{ messages[0].content }}"},
            {"name": "tool_use", "template": "T:{{ tools[0].function.name }}"},
        ],
    });
    let dir = model_dir("named", &config, |_| {});
    let tok = ModelTokenizer::from_dir(&dir).unwrap();
    let user = json!({"role": "user", "content": "hi"});
    assert_eq!(
        tok.render_chat(&json!({"messages": [user]})).unwrap(),
        "D:<|endoftext|>hi"
    );
    let tools = json!([{"type": "function", "function": {"name": "lookup"}}]);
    assert_eq!(
        tok.render_chat(&json!({"messages": [user], "tools": tools}))
            .unwrap(),
        "T:lookup"
    );
    assert_eq!(tok.eos_token_id(), Some(151645));

    std::fs::write(dir.join("chat_template.jinja"), "J:{{ messages | length }}").unwrap();
    let tok = ModelTokenizer::from_dir(&dir).unwrap();
    assert_eq!(
        tok.render_chat(&json!({"messages": [user, user]})).unwrap(),
        "J:2"
    );
}

#[test]
fn templates_that_name_the_developer_role_get_developer_messages() {
    // vLLM rewrites developer messages only for templates that never quote "developer".
    let template = "{% for m in messages %}{{ m.role }}={{ m.content }};{% endfor %}";
    let aware = format!("{{# handles 'developer' #}}{template}");
    let chat = json!({"messages": [
        {"role": "user", "content": "a"},
        {"role": "developer", "content": "d"},
    ]});
    let render = |name: &str, template: &str| {
        let dir = model_dir(name, &json!({"chat_template": template}), |_| {});
        ModelTokenizer::from_dir(&dir)
            .unwrap()
            .render_chat(&chat)
            .unwrap()
    };
    assert_eq!(render("dev-aware", &aware), "user=a;developer=d;");
    assert_eq!(render("dev-unaware", template), "system=d;user=a;");
}

#[test]
fn models_without_template_still_serve_completions() {
    let dir = model_dir("no-template", &json!({}), |_| {});
    let tok = ModelTokenizer::from_dir(&dir).unwrap();
    assert!(!tok.has_chat_template());
    let err = tok
        .tokenize_request(
            ApiKind::Chat,
            &json!({"messages": [{"role": "user", "content": "x"}]}),
        )
        .unwrap_err();
    assert!(
        matches!(err, TokenizeError::Template(_)) && !err.is_client_error(),
        "{err}"
    );
    assert_eq!(
        tok.tokenize_request(ApiKind::Completions, &json!({"prompt": "a b"}))
            .unwrap(),
        tok.encode("a b").unwrap()
    );
}

#[test]
fn post_processor_special_tokens_wrap_completions_text() {
    // Qwen3 adds nothing; give the tokenizer a Llama-style BOS + EOS template to check that
    // `add_special_tokens` follows the post-processor for completions and for chat opt-in.
    let dir = model_dir(
        "bos",
        &json!({"chat_template": "{{ messages[0].content }}"}),
        |t| {
            t["post_processor"] = json!({
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                           {"SpecialToken": {"id": "<|im_end|>", "type_id": 0}}],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {
                    "<|endoftext|>": {"id": "<|endoftext|>", "ids": [151643], "tokens": ["<|endoftext|>"]},
                    "<|im_end|>": {"id": "<|im_end|>", "ids": [151645], "tokens": ["<|im_end|>"]},
                },
            });
        },
    );
    let tok = ModelTokenizer::from_dir(&dir).unwrap();
    for text in ["Hello there", "", "<|im_start|>x"] {
        let ids = tok
            .tokenize_request(ApiKind::Completions, &json!({"prompt": text}))
            .unwrap();
        assert_eq!(ids, tok.encode_uncached(text, true).unwrap(), "{text:?}");
        assert_eq!((ids.first(), ids.last()), (Some(&151643), Some(&151645)));
        let plain = tok
            .tokenize_request(
                ApiKind::Completions,
                &json!({"prompt": text, "add_special_tokens": false}),
            )
            .unwrap();
        assert_eq!(plain, tok.encode_uncached(text, false).unwrap());
    }
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}]});
    assert_eq!(
        tok.tokenize_request(ApiKind::Chat, &chat).unwrap(),
        tok.encode("Hi").unwrap(),
        "chat adds none by default"
    );
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "add_special_tokens": true});
    assert_eq!(
        tok.tokenize_request(ApiKind::Chat, &chat).unwrap(),
        tok.encode_uncached("Hi", true).unwrap()
    );
}

#[test]
fn missing_model_files_are_server_side_errors() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("tokenize-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let err = ModelTokenizer::from_dir(&dir).unwrap_err();
    assert!(
        matches!(&err, TokenizeError::ModelDir { path, .. } if path.ends_with("tokenizer.json")),
        "{err}"
    );
    assert!(!err.is_client_error());
}

/// Boolean fields read as vLLM's pydantic models read them: `0`/`1` and words such as
/// `"yes"`/`"off"` mean what `true`/`false` mean.
#[test]
fn chat_booleans_take_vllms_lax_forms() {
    let tok = qwen();
    let user = json!({"role": "user", "content": "hi"});
    let ids = |field: &str, value: Value| {
        tok.tokenize_request(ApiKind::Chat, &json!({"messages": [user], field: value}))
            .unwrap()
    };
    for (lax, strict) in [("yes", true), ("off", false), ("1", true), ("0", false)] {
        assert_eq!(
            ids("add_generation_prompt", json!(lax)),
            ids("add_generation_prompt", json!(strict)),
            "{lax}"
        );
    }
    assert_eq!(
        ids("add_generation_prompt", json!(0)),
        ids("add_generation_prompt", json!(false))
    );
    assert_ne!(
        ids("add_generation_prompt", json!("no")),
        ids("add_generation_prompt", json!(true))
    );
    assert_eq!(
        ids("continue_final_message", json!("false")),
        ids("continue_final_message", json!(false))
    );
}
