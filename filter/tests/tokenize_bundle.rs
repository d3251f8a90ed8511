//! A tokenizer loaded from the control plane's bundle (as a VM loads it) gives the hashed
//! prompt the control plane's own tokenizer gives: same ISL, same block hashes, and the body's
//! fields without its prompt (but for the tools' names). Needs the Qwen3 files (`scripts/setup.sh`, or
//! `SWITCHYARD_MODEL_DIR`).

use serde_json::json;
use switchyard_filter::tokenize::{BodyFallback, LoadedTokenizer};
use switchyard_protocol::hash::{sequence_hashes, BlockSize, HashSeed};
use switchyard_protocol::route::ApiKind;
use switchyard_protocol::route_input::HashedPrompt;
use switchyard_protocol::tokenize::{
    default_model_dir, ModelTokenizer, TokenizerBundle, TokenizerFiles,
};

#[test]
fn a_bundle_tokenizer_hashes_as_the_control_plane_tokenizes() {
    let dir = default_model_dir();
    let bundle = TokenizerBundle {
        v: 1,
        model: Some("qwen3".into()),
        block_size: 16,
        files: TokenizerFiles::read_dir(&dir).expect("the model folder (scripts/setup.sh)"),
    };
    let json = serde_json::to_vec(&bundle).expect("serialises");
    let in_vm = LoadedTokenizer::from_bundle_json(&json).expect("loads");
    let control_plane = ModelTokenizer::from_dir(&dir).expect("loads");

    let body = json!({
        "model": "qwen3",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Tell me about KV caches. ".repeat(200)},
        ],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"b": 1, "a": 2}}}],
        "max_tokens": 8,
        "stream": true,
    });
    let hashed = in_vm
        .hashed_prompt(ApiKind::Chat, &body)
        .expect("tokenizes");
    let tokens = control_plane
        .tokenize_request(ApiKind::Chat, &body)
        .expect("tokenizes");
    let block_size = BlockSize::try_new(16).unwrap();
    assert_eq!(hashed.isl as usize, tokens.len());
    assert!(hashed.isl > 1_000, "{}", hashed.isl);
    assert_eq!(
        hashed.hashes,
        sequence_hashes(&tokens, block_size, HashSeed::default())
    );
    assert_eq!(
        hashed.fields,
        br#"{"model":"qwen3","tools":[{"type":"function","function":{"name":"f"}}],"max_tokens":8,"stream":true}"#
    );
    assert_eq!(HashedPrompt::decode(&hashed.encode()), Ok(hashed));

    // A body the tokenizer refuses goes as the body (the control plane answers it).
    let bad = json!({"model": "qwen3", "messages": [{"role": "user", "content": 42}]});
    assert_eq!(
        in_vm.hashed_prompt(ApiKind::Chat, &bad),
        Err(BodyFallback::InvalidRequest)
    );
}
