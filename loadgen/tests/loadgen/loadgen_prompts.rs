//! Prompt synthesis is token-exact under the real Qwen3 tokenizer: every planned token is one
//! real token, equal trace hash ids give equal token blocks, and a prefix cache (Switchyard's
//! block hashes) sees exactly the sharing the trace describes.

use switchyard_loadgen::prompts::{BodyBuilder, PromptFraming, PromptSpec, Segment};
use switchyard_loadgen::trace::{parse_trace, plan_trace};
use switchyard_loadgen::vocab::{Vocabulary, VOCABULARY_SIZE};
use switchyard_loadgen::PlannedRequest;
use switchyard_protocol::hash::{sequence_hashes, BlockSize, HashSeed};
use switchyard_protocol::route::ApiKind;
use switchyard_protocol::tokenize::{default_model_dir, ModelTokenizer};

fn tokenizer() -> ModelTokenizer {
    let dir = default_model_dir();
    ModelTokenizer::from_dir(&dir).unwrap_or_else(|e| {
        panic!(
            "no tokenizer in {} ({e}); run scripts/setup.sh",
            dir.display()
        )
    })
}

fn builder(tok: &ModelTokenizer, api: ApiKind, content_seed: u64) -> BodyBuilder {
    BodyBuilder {
        api,
        model: "Qwen/Qwen3-235B-A22B".into(),
        vocab: Vocabulary::from_tokenizer(tok).expect("vocabulary"),
        content_seed,
    }
}

#[test]
fn every_vocabulary_word_is_one_token_and_prompts_tokenize_word_by_word() {
    let tok = tokenizer();
    let vocab = Vocabulary::from_tokenizer(&tok).unwrap();
    assert_eq!(vocab.words().len(), VOCABULARY_SIZE);
    for (i, w) in vocab.words().iter().enumerate() {
        assert_eq!(tok.encode(w).unwrap(), vec![vocab.id(i)], "{w:?}");
    }
    // A long multi-block prompt, including a partial block and a block repeated.
    let spec = PromptSpec {
        segments: vec![
            Segment {
                block: 0,
                tokens: 512,
            },
            Segment {
                block: 91,
                tokens: 512,
            },
            Segment {
                block: 7,
                tokens: 300,
            },
            Segment {
                block: 0,
                tokens: 40,
            },
        ],
    };
    let text = spec.text(&vocab, 11);
    let expected = spec.token_ids(&vocab, 11);
    assert_eq!(expected.len(), 1364);
    assert_eq!(tok.encode(&text).unwrap(), expected, "cached path");
    assert_eq!(
        tok.encode_uncached(&text, false).unwrap(),
        expected,
        "plain HF path"
    );
}

#[test]
fn chat_and_completions_frame_the_content_verbatim() {
    let tok = tokenizer();
    let chat = builder(&tok, ApiKind::Chat, 3);
    let framing = PromptFraming::measure(&tok, &chat).unwrap();
    // Qwen3: `<|im_start|>user\n` before, `<|im_end|>\n<|im_start|>assistant\n` after.
    assert_eq!((framing.prefix_tokens(), framing.suffix_tokens()), (3, 5));
    let completions = builder(&tok, ApiKind::Completions, 3);
    let framing = PromptFraming::measure(&tok, &completions).unwrap();
    assert_eq!((framing.prefix_tokens(), framing.suffix_tokens()), (0, 0));
}

/// Longest common prefix of two id sequences.
fn lcp(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Tokens two trace prompts share by their hash ids: whole shared blocks, plus the shorter
/// length of a block id they share at different lengths (a partial tail).
fn planned_shared_tokens(a: &PlannedRequest, b: &PlannedRequest) -> usize {
    let mut shared = 0;
    for (x, y) in a.prompt.segments.iter().zip(&b.prompt.segments) {
        if x.block != y.block {
            break;
        }
        shared += x.tokens.min(y.tokens) as usize;
        if x.tokens != y.tokens {
            break;
        }
    }
    shared
}

#[test]
fn trace_prompts_share_exactly_the_traces_blocks_under_the_chat_template() {
    let tok = tokenizer();
    let chat = builder(&tok, ApiKind::Chat, 5);
    let framing = PromptFraming::measure(&tok, &chat).unwrap();
    // Rows modelled on the trace: a shared system block, a multi-turn conversation whose
    // turns extend each other (the last block of a turn partial, then full in the next), an
    // unrelated conversation, and a block id shared without its prefix.
    let text = r#"{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]}
{"timestamp": 1, "input_length": 1700, "output_length": 5, "hash_ids": [0, 1, 2, 3]}
{"timestamp": 2, "input_length": 2600, "output_length": 5, "hash_ids": [0, 1, 2, 3, 4, 5]}
{"timestamp": 3, "input_length": 900, "output_length": 5, "hash_ids": [0, 6]}
{"timestamp": 4, "input_length": 1024, "output_length": 5, "hash_ids": [7, 1]}"#;
    let workload = plan_trace(&parse_trace(text, 512).unwrap(), 512, 5);
    let ids: Vec<Vec<u32>> = workload
        .requests
        .iter()
        .map(|r| tok.tokenize_request(ApiKind::Chat, &chat.body(r)).unwrap())
        .collect();
    for (r, ids) in workload.requests.iter().zip(&ids) {
        assert_eq!(
            ids.len() as u64,
            framing.prompt_tokens(r.isl()),
            "request {}",
            r.id
        );
        // The framing predicts the server's token ids without tokenizing the request.
        assert_eq!(
            ids,
            &framing.token_ids(&r.prompt, &chat.vocab, workload.content_seed)
        );
        let content = r.prompt.token_ids(&chat.vocab, workload.content_seed);
        let start = framing.prefix_tokens() as usize;
        assert_eq!(&ids[start..start + content.len()], &content[..]);
    }
    let prefix = framing.prefix_tokens() as usize;
    for a in 0..ids.len() {
        for b in (a + 1)..ids.len() {
            let planned =
                prefix + planned_shared_tokens(&workload.requests[a], &workload.requests[b]);
            let actual = lcp(&ids[a], &ids[b]);
            // Different block ids differ by their second token at the latest.
            assert!(
                actual == planned || actual == planned + 1,
                "requests {a} and {b}: planned {planned} shared tokens, got {actual}"
            );
            for kv_block in [16u32, 64] {
                let size = BlockSize::try_new(kv_block).unwrap();
                let ha = sequence_hashes(&ids[a], size, HashSeed::default());
                let hb = sequence_hashes(&ids[b], size, HashSeed::default());
                let common = ha.iter().zip(&hb).take_while(|(x, y)| x == y).count();
                assert_eq!(common, planned / kv_block as usize, "{a}/{b} at {kv_block}");
            }
        }
    }
    // By hand: rows 1 and 2 share blocks 0-2 (1536) and row 1's 164-token tail of block 3.
    assert_eq!(
        planned_shared_tokens(&workload.requests[1], &workload.requests[2]),
        1700
    );
    // Rows 0 and 1 share blocks 0-1 and row 0's 76-token tail of block 2; rows 3 and 4 none.
    assert_eq!(
        planned_shared_tokens(&workload.requests[3], &workload.requests[4]),
        0
    );
    assert_eq!(
        planned_shared_tokens(&workload.requests[0], &workload.requests[1]),
        1100
    );
}

#[test]
fn real_trace_rows_tokenize_to_their_input_length() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../data/mooncake_conversation_trace.jsonl"
    );
    let text = std::fs::read_to_string(path).expect("the Mooncake trace in data/");
    let head: String = text.lines().take(60).map(|l| format!("{l}\n")).collect();
    let workload = plan_trace(&parse_trace(&head, 512).unwrap(), 512, 1);
    let tok = tokenizer();
    let completions = builder(&tok, ApiKind::Completions, 1);
    for r in &workload.requests {
        let ids = tok
            .tokenize_request(ApiKind::Completions, &completions.body(r))
            .unwrap();
        assert_eq!(ids.len() as u64, r.isl(), "request {}", r.id);
        assert_eq!(ids, r.prompt.token_ids(&completions.vocab, 1));
    }
}
