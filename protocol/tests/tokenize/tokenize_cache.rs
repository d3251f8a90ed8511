//! The segment cache never changes a token: cached (segmented) tokenization gives the ids one
//! whole-text call to the HF tokenizer gives, for random texts and random multi-turn chats,
//! including unicode, whitespace runs and text that spells out special tokens; and cutting
//! segments into chunks (at every boundary the cutter allows) changes no token either, for
//! random texts and for one message that grows turn by turn.
#![cfg(feature = "tokenizer")]

use std::sync::OnceLock;

use proptest::prelude::*;
use serde_json::{json, Value};
use switchyard_protocol::route::ApiKind;
use switchyard_protocol::tokenize::{default_model_dir, ModelTokenizer};

fn load(cache_bytes: usize) -> ModelTokenizer {
    let dir = default_model_dir();
    assert!(
        dir.join("tokenizer.json").is_file(),
        "Qwen3 model files missing in {}: run scripts/setup.sh (or set SWITCHYARD_MODEL_DIR)",
        dir.display()
    );
    ModelTokenizer::from_dir_with_cache_bytes(&dir, cache_bytes).expect("load model dir")
}

/// Shared across cases so later cases hit segments cached by earlier ones.
fn roomy() -> &'static ModelTokenizer {
    static TOK: OnceLock<ModelTokenizer> = OnceLock::new();
    TOK.get_or_init(|| load(64 << 20))
}

/// Segments cut at every boundary the chunk cutter allows (1-byte chunks): the most cuts any
/// text can get, so any inexact cut shows.
fn finest() -> &'static ModelTokenizer {
    static TOK: OnceLock<ModelTokenizer> = OnceLock::new();
    TOK.get_or_init(|| load(64 << 20).with_chunk_bytes(1).expect("probes"))
}

#[test]
fn qwen3_segments_are_cut_into_chunks() {
    assert!(
        roomy().chunks_segments(),
        "the default cutter is on for Qwen3"
    );
    assert!(finest().chunks_segments());
    let off = load(1 << 20).with_chunk_bytes(0).expect("probes");
    assert!(!off.chunks_segments());
    // Off still encodes exactly, whole segments at a time.
    let text = "one long message that keeps growing, turn after turn";
    assert_eq!(
        off.encode(text).unwrap(),
        off.encode_uncached(text, false).unwrap()
    );
}

/// A 4 KiB cache: constant eviction, to show evictions cannot corrupt results.
fn cramped() -> &'static ModelTokenizer {
    static TOK: OnceLock<ModelTokenizer> = OnceLock::new();
    TOK.get_or_init(|| load(4 << 10))
}

const FRAGMENTS: &[&str] = &[
    "hello",
    " world",
    "The",
    " quick",
    "'s",
    "'ll",
    "don't",
    "12345",
    "3.14",
    " ",
    "  ",
    "   ",
    "\n",
    "\n\n",
    "\r\n",
    "\t",
    " \n ",
    "ü",
    "数据",
    "😀",
    "e\u{301}",
    "\u{200b}",
    "Ωmega",
    "naïve",
    "<|im_end|>",
    "<|im_start|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<|endoftext|>",
    "<tool_response>",
    "<|im_",
    "<|",
    "|>",
    "<",
    ">",
    "im_end",
    "{\"a\": 1}",
    "```rust\n",
    "fn main() {}",
    "!!!",
    "...",
    "-",
    "__init__",
];

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::collection::vec(prop::sample::select(FRAGMENTS), 0..16).prop_map(|f| f.concat()),
        1 => "\\PC{0,40}",
        1 => "[ \\t\\r\\n]{0,8}[a-z<|>_]{0,12}[ \\t\\r\\n]{0,8}",
        // Words and what borders them: where chunk cuts fall.
        2 => "[a-zA-Z]{1,6}( {1,2}[a-zA-Zé'.,!0-9\\n]{1,6}){0,12}",
    ]
}

fn conversation() -> impl Strategy<Value = Vec<(String, String)>> {
    let role = prop::sample::select(vec!["user", "assistant", "user", "system", "tool"]);
    prop::collection::vec((role, text()), 1..8)
        .prop_map(|msgs| msgs.into_iter().map(|(r, t)| (r.to_string(), t)).collect())
}

fn chat_body(messages: &[(String, String)], thinking: bool) -> Value {
    let messages: Vec<Value> = messages
        .iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    json!({"messages": messages, "chat_template_kwargs": {"enable_thinking": thinking}})
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn cached_encode_equals_whole_text_encode(text in text()) {
        let want = roomy().encode_uncached(&text, false).unwrap();
        prop_assert_eq!(&roomy().encode(&text).unwrap(), &want, "cold");
        prop_assert_eq!(&roomy().encode(&text).unwrap(), &want, "cached");
        prop_assert_eq!(&cramped().encode(&text).unwrap(), &want, "under eviction");
        prop_assert_eq!(&finest().encode(&text).unwrap(), &want, "cut at every boundary");
        prop_assert_eq!(
            roomy().tokenize_request(ApiKind::Completions, &json!({"prompt": text})).unwrap(),
            roomy().encode_uncached(&text, true).unwrap()
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn cached_chat_tokens_equal_whole_prompt_tokens(
        turns in conversation(),
        next in text(),
        thinking in any::<bool>(),
    ) {
        for tok in [roomy(), cramped(), finest()] {
            let body = chat_body(&turns, thinking);
            let rendered = tok.render_chat(&body).unwrap();
            let want = tok.encode_uncached(&rendered, false).unwrap();
            prop_assert_eq!(&tok.tokenize_request(ApiKind::Chat, &body).unwrap(), &want);

            // The next turn reuses the cached segments of this one.
            let mut grown = turns.clone();
            grown.push(("assistant".into(), "ok".into()));
            grown.push(("user".into(), next.clone()));
            let body = chat_body(&grown, thinking);
            let rendered = tok.render_chat(&body).unwrap();
            let want = tok.encode_uncached(&rendered, false).unwrap();
            prop_assert_eq!(tok.tokenize_request(ApiKind::Chat, &body).unwrap(), want);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// One user message that gains text every turn (trace replays, many agent frameworks):
    /// every turn reuses the chunks of the one before, and still equals a whole-prompt encode.
    #[test]
    fn growing_single_message_tokens_equal_whole_prompt_tokens(
        additions in prop::collection::vec(text(), 1..6),
    ) {
        for tok in [roomy(), finest()] {
            let mut content = String::new();
            for addition in &additions {
                content.push_str(addition);
                let body = json!({"messages": [{"role": "user", "content": content}]});
                let rendered = tok.render_chat(&body).unwrap();
                prop_assert_eq!(
                    tok.tokenize_request(ApiKind::Chat, &body).unwrap(),
                    tok.encode_uncached(&rendered, false).unwrap()
                );
            }
        }
    }
}

#[test]
fn a_plan_leaves_only_the_uncached_text_and_finishes_to_the_same_ids() {
    let tok = load(64 << 20);
    let history: Vec<(String, String)> = (0..8)
        .flat_map(|t| {
            [
                (
                    "user".to_string(),
                    format!("question {t} about the cache and the router"),
                ),
                (
                    "assistant".to_string(),
                    format!("answer {t}: the decode worker keeps it"),
                ),
            ]
        })
        .collect();
    let first = chat_body(&history, false);
    let cold = tok.plan_request(ApiKind::Chat, &first).unwrap();
    let rendered = tok.render_chat(&first).unwrap();
    // Cold: every text byte is still to encode (the added tokens are not text).
    assert!(
        cold.missing_bytes() > rendered.len() / 2,
        "{}",
        cold.missing_bytes()
    );
    let ids = tok.finish(cold).unwrap();
    assert_eq!(ids, tok.encode_uncached(&rendered, false).unwrap());

    // The next turn: only its new message is left, and the ids are whole-text ids.
    let mut next = history.clone();
    next.push(("user".into(), "one more question".into()));
    let body = chat_body(&next, false);
    let warm = tok.plan_request(ApiKind::Chat, &body).unwrap();
    assert!(
        (1..128).contains(&warm.missing_bytes()),
        "{}",
        warm.missing_bytes()
    );
    let expected = tok
        .encode_uncached(&tok.render_chat(&body).unwrap(), false)
        .unwrap();
    assert_eq!(tok.finish(warm).unwrap(), expected);
    // Asked again, nothing is left.
    assert_eq!(
        tok.plan_request(ApiKind::Chat, &body)
            .unwrap()
            .missing_bytes(),
        0
    );

    // A completions prompt borrowed from its body finishes the same once owned.
    let completion = json!({"prompt": "a prompt borrowed from the body"});
    let owned = tok
        .plan_request(ApiKind::Completions, &completion)
        .unwrap()
        .into_owned();
    drop(completion);
    assert_eq!(
        tok.finish(owned).unwrap(),
        tok.encode_uncached("a prompt borrowed from the body", true)
            .unwrap()
    );
}
