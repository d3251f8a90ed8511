//! Token exactness against transformers: the ids in `fixtures/qwen3_tokenize.json` were made by
//! `fixtures/gen_fixtures.py` (vLLM's request preprocessing + transformers'
//! `apply_chat_template(..., tokenize=True)`), and must come out of [`ModelTokenizer`]
//! identically, cold and from the segment cache. Besides hand-written cases the fixture holds
//! 40 seeded random conversations, rendered by Jinja2 there and by minijinja here.
#![cfg(feature = "tokenizer")]

use serde_json::Value;
use switchyard_protocol::route::ApiKind;
use switchyard_protocol::tokenize::{default_model_dir, ModelTokenizer, TokenizeError};

const FIXTURE: &str = include_str!("../fixtures/qwen3_tokenize.json");

fn load_tokenizer() -> ModelTokenizer {
    let dir = default_model_dir();
    assert!(
        dir.join("tokenizer.json").is_file(),
        "Qwen3 model files missing in {}: run scripts/setup.sh (or set SWITCHYARD_MODEL_DIR)",
        dir.display()
    );
    ModelTokenizer::from_dir(&dir).expect("load model dir")
}

/// Fails with the first differing position and the text around it, decoded.
fn assert_same_ids(tok: &ModelTokenizer, case: &str, got: &[u32], want: &[u32]) {
    if got == want {
        return;
    }
    let at = got
        .iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(want.len()));
    let around = |ids: &[u32]| {
        let lo = at.saturating_sub(5);
        let hi = (at + 5).min(ids.len());
        tok.decode(&ids[lo..hi]).unwrap_or_default()
    };
    panic!(
        "{case}: ids differ at {at} (len {} vs expected {}): got {:?} expected {:?}",
        got.len(),
        want.len(),
        around(got),
        around(want)
    );
}

fn ids_of(case: &Value) -> Vec<u32> {
    serde_json::from_value(case["ids"].clone()).expect("ids")
}

fn fixture() -> Value {
    serde_json::from_str(FIXTURE).expect("fixture is JSON")
}

#[test]
fn chat_requests_match_transformers_exactly() {
    let tok = load_tokenizer();
    let fixture = fixture();
    let cases = fixture["chat"].as_array().expect("chat cases");
    assert!(cases.len() >= 50, "fixture lost cases");
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let body = &case["body"];
        let rendered = tok
            .render_chat(body)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            rendered,
            case["rendered"].as_str().unwrap(),
            "{name}: rendered prompt differs"
        );
        let want = ids_of(case);
        for pass in ["cold", "cached"] {
            let got = tok
                .tokenize_request(ApiKind::Chat, body)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_same_ids(&tok, &format!("{name} ({pass})"), &got, &want);
        }
        let whole = tok.encode_uncached(&rendered, false).unwrap();
        assert_same_ids(&tok, &format!("{name} (uncached)"), &whole, &want);
    }
    assert!(
        tok.cache_stats().hits > 0,
        "second passes must be served from the segment cache"
    );
}

#[test]
fn completions_prompts_match_transformers_exactly() {
    let tok = load_tokenizer();
    let fixture = fixture();
    let cases = fixture["completions"]
        .as_array()
        .expect("completions cases");
    assert!(cases.len() >= 5, "fixture lost cases");
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let got = tok
            .tokenize_request(ApiKind::Completions, &case["body"])
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_same_ids(&tok, name, &got, &ids_of(case));
    }
}

#[test]
fn fixture_key_order_is_what_the_template_prints() {
    // Guards the premise of the tools case: the body's keys are not alphabetical, and the
    // rendered prompt keeps vLLM's order (pydantic fields first, then the body's order).
    let fixture = fixture();
    let case = fixture["chat"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "tools_non_alphabetical_non_ascii");
    let case = case.expect("tools case");
    let keys: Vec<&str> = case["body"]["tools"][0]["function"]["parameters"]["properties"]
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    assert_eq!(keys, ["zip", "city", "units", "days", "detailed"]);
    let rendered = case["rendered"].as_str().unwrap();
    assert!(rendered
        .contains(r#"{"type": "function", "function": {"name": "get_weather", "description": "#));
    assert!(rendered.contains(r#""properties": {"zip": "#));
}

/// Qwen3's files with `fixtures/feature_template.jinja` as `chat_template.jinja`, which
/// transformers (and so [`ModelTokenizer`]) prefers to the config's template.
fn feature_template_tokenizer() -> ModelTokenizer {
    let qwen = default_model_dir();
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("tokenize-features-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(qwen.join(file), dir.join(file)).unwrap_or_else(|e| {
            panic!("{file} from {} (run scripts/setup.sh): {e}", qwen.display())
        });
    }
    std::fs::write(
        dir.join("chat_template.jinja"),
        include_str!("../fixtures/feature_template.jinja"),
    )
    .unwrap();
    ModelTokenizer::from_dir(&dir).expect("load scratch model dir")
}

#[test]
fn feature_template_renders_like_jinja2() {
    let tok = feature_template_tokenizer();
    let fixture = fixture();
    let cases = fixture["feature_template"]
        .as_array()
        .expect("feature-template cases");
    assert!(cases.len() >= 3, "fixture lost cases");
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let result = tok.render_chat(&case["body"]);
        if let Some(error) = case["error"].as_str() {
            match result {
                Err(e @ TokenizeError::InvalidRequest { .. }) => {
                    assert!(
                        e.to_string().contains(error),
                        "{name}: {e} does not mention {error:?}"
                    )
                }
                other => {
                    panic!("{name}: expected the template to reject it ({error}), got {other:?}")
                }
            }
            continue;
        }
        let rendered = result.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            rendered,
            case["rendered"].as_str().unwrap(),
            "{name}: rendered prompt differs"
        );
        let got = tok.tokenize_request(ApiKind::Chat, &case["body"]).unwrap();
        assert_same_ids(&tok, name, &got, &ids_of(case));
    }
}
