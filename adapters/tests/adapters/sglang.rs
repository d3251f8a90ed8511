//! SGLang's KV events read by the vLLM decoder and mapper. SGLang publishes vLLM's framing
//! (`[topic, seq (8 bytes, big-endian), msgpack payload]`) with `msgspec`'s `array_like` tagged
//! events: `[ts, events, attn_dp_rank]` (older SGLang: `[ts, events]`), `["BlockStored",
//! block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium?]`,
//! `["BlockRemoved", block_hashes, medium?]`, `["AllBlocksCleared"]` (a salted prompt's
//! `BlockStored` adds a `{"cache_salt": ...}` map after `medium`); one `BlockStored` per
//! page (`block_size` = page size), hashes signed int64. The bytes here are built by hand in
//! that shape (no SGLang capture was available).

use crate::common;

use common::{message, pack};
use rmpv::Value;
use switchyard_adapters::vllm::feed::{FeedAction, KvFeed};
use switchyard_adapters::vllm::frame::{decode_message, decode_parts, Limits};
use switchyard_adapters::vllm::mapper::MapperConfig;
use switchyard_adapters::vllm::{VllmBatch, VllmEvent};
use switchyard_protocol::hash::{sequence_hashes, BlockSize, HashSeed};
use switchyard_protocol::kv::{EngineBlockId, KvEvent};
use switchyard_protocol::worker::WorkerId;

const PAGE: u32 = 4;

/// SGLang's newer hashes: SHA-256 chains cut to a signed int64, often negative.
const H1: i64 = -8_102_528_774_195_310_455;
const H2: i64 = 4_411_620_119_839_116_921;

fn ints(values: &[i64]) -> Value {
    Value::Array(values.iter().map(|&v| Value::from(v)).collect())
}

fn page_tokens(page: u32) -> Vec<u32> {
    (page * PAGE..(page + 1) * PAGE).map(|t| t + 500).collect()
}

/// `["BlockStored", [hash], parent, token_ids, page_size, lora_id, medium]` (`medium`
/// absent in older SGLang).
fn stored(hash: i64, parent: Option<i64>, tokens: &[u32], medium: Option<&str>) -> Value {
    let mut items = vec![
        Value::from("BlockStored"),
        ints(&[hash]),
        parent.map_or(Value::Nil, Value::from),
        Value::Array(tokens.iter().map(|&t| Value::from(t)).collect()),
        Value::from(PAGE),
        Value::Nil,
    ];
    if let Some(m) = medium {
        items.push(Value::from(m));
    }
    Value::Array(items)
}

fn as_u64(hash: i64) -> u64 {
    u64::from_ne_bytes(hash.to_ne_bytes())
}

/// The newer payload: `[ts, events, attn_dp_rank]`.
fn newer_batch(seq: u64, events: Vec<Value>) -> VllmBatch {
    let payload = Value::Array(vec![
        Value::F64(1_765_000_000.25),
        Value::Array(events),
        Value::from(1),
    ]);
    decode_message(&message(seq, &payload)).expect("SGLang's batch decodes")
}

#[test]
fn newer_sglang_batches_decode_with_their_attention_dp_rank() {
    let batch = newer_batch(
        0,
        vec![
            stored(H1, None, &page_tokens(0), Some("GPU")),
            stored(H2, Some(H1), &page_tokens(1), Some("GPU")),
            Value::Array(vec![
                Value::from("BlockRemoved"),
                ints(&[H2]),
                Value::from("GPU"),
            ]),
            Value::Array(vec![Value::from("AllBlocksCleared")]),
        ],
    );
    assert_eq!(
        batch.data_parallel_rank,
        Some(1),
        "attn_dp_rank, same place"
    );
    assert!(batch.skipped.is_empty(), "{:?}", batch.skipped);
    assert_eq!(
        batch.events[1],
        VllmEvent::BlockStored {
            block_hashes: vec![as_u64(H2)],
            parent: Some(as_u64(H1)),
            token_ids: page_tokens(1),
            block_size: PAGE,
            lora_id: None,
            medium: Some("GPU".into()),
            group_idx: None,
            hashed_with_extra_keys: false,
        }
    );
    assert_eq!(
        batch.events[2],
        VllmEvent::BlockRemoved {
            block_hashes: vec![as_u64(H2)],
            medium: Some("GPU".into()),
            group_idx: None,
        }
    );
    assert_eq!(batch.events[3], VllmEvent::AllBlocksCleared);
}

#[test]
fn older_sglang_batches_without_rank_or_medium_decode() {
    let payload = Value::Array(vec![
        Value::F64(1_700_000_000.0),
        Value::Array(vec![stored(H1, None, &page_tokens(0), None)]),
    ]);
    let bytes = pack(&payload);
    let batch = decode_parts(b"", &5u64.to_be_bytes(), &bytes, &Limits::DEFAULT).unwrap();
    assert_eq!((batch.seq, batch.data_parallel_rank), (5, None));
    assert!(matches!(
        &batch.events[0],
        VllmEvent::BlockStored {
            medium: None,
            lora_id: None,
            ..
        }
    ));
}

#[test]
fn salted_sglang_pages_are_not_taken_for_plain_ones() {
    // `BlockStoredWithMetadata`: the same tag, one more item, a map, after `medium`.
    let Value::Array(mut items) = stored(H1, None, &page_tokens(0), Some("GPU")) else {
        unreachable!()
    };
    items.push(Value::Map(vec![(
        Value::from("cache_salt"),
        Value::from("tenant-a"),
    )]));
    let batch = newer_batch(0, vec![Value::Array(items)]);
    assert!(batch.skipped.is_empty(), "{:?}", batch.skipped);
    assert!(matches!(
        &batch.events[0],
        VllmEvent::BlockStored {
            hashed_with_extra_keys: true,
            ..
        }
    ));
}

#[test]
fn sglang_pages_chained_by_parent_get_the_routers_hashes() {
    let mut feed = KvFeed::new(
        WorkerId("sglang-0".into()),
        3,
        MapperConfig::new(BlockSize::try_new(PAGE).unwrap()),
    );
    let batch = newer_batch(
        0,
        vec![
            stored(H1, None, &page_tokens(0), Some("GPU")),
            stored(H2, Some(H1), &page_tokens(1), Some("GPU")),
        ],
    );
    let actions = feed.on_live(batch);
    let prompt: Vec<u32> = page_tokens(0).into_iter().chain(page_tokens(1)).collect();
    let want = sequence_hashes(
        &prompt,
        BlockSize::try_new(PAGE).unwrap(),
        HashSeed::default(),
    );
    let published: Vec<&KvEvent> = actions
        .iter()
        .filter_map(|a| match a {
            FeedAction::Publish(batch) => Some(batch),
            FeedAction::RequestReplay { .. } => None,
        })
        .flat_map(|b| b.events.iter())
        .collect();
    assert_eq!(published[0], &KvEvent::Cleared, "the feed's first batch");
    let KvEvent::Stored { parent, blocks, .. } = published[2] else {
        panic!("{published:?}")
    };
    assert_eq!(
        *parent,
        Some(want[0]),
        "chained through SGLang's parent hash"
    );
    assert_eq!(blocks[0].seq_hash, want[1]);
    assert_eq!(blocks[0].block_id, EngineBlockId(as_u64(H2)));
    let KvEvent::Stored { blocks, .. } = published[1] else {
        panic!("{published:?}")
    };
    assert_eq!(blocks[0].seq_hash, want[0]);
    // A CPU copy (hierarchical cache) is not the GPU's.
    let actions = feed.on_live(newer_batch(
        1,
        vec![Value::Array(vec![
            Value::from("BlockRemoved"),
            ints(&[H2]),
            Value::from("CPU_PINNED"),
        ])],
    ));
    assert!(actions.is_empty(), "{actions:?}");
}

/// SGLang under speculative decoding (EAGLE keys its radix tree by bigrams) gives each token of
/// a page as `[token, next token]`. A pair reads as its first token, so the pages chain and hash
/// as a plain engine's would; until 2026-12-06 such a batch did not decode, and the replay's
/// copy of it neither, so the worker's whole cache view was dropped again and again.
#[test]
fn bigram_pages_read_as_their_tokens() {
    let bigrams = |page: u32| {
        let tokens = page_tokens(page);
        Value::Array(
            tokens
                .iter()
                .map(|&t| Value::Array(vec![Value::from(t), Value::from(t + 1)]))
                .collect(),
        )
    };
    let page = |hash: i64, parent: Option<i64>, n: u32| {
        let Value::Array(mut items) = stored(hash, parent, &[], Some("GPU")) else {
            unreachable!()
        };
        items[3] = bigrams(n);
        Value::Array(items)
    };
    let batch = newer_batch(0, vec![page(H1, None, 0), page(H2, Some(H1), 1)]);
    assert!(batch.skipped.is_empty(), "{:?}", batch.skipped);
    assert!(matches!(
        &batch.events[1],
        VllmEvent::BlockStored { token_ids, hashed_with_extra_keys: false, .. }
            if *token_ids == page_tokens(1)
    ));
    let published = published_by_a_new_feed(batch);
    let prompt: Vec<u32> = page_tokens(0).into_iter().chain(page_tokens(1)).collect();
    let want = sequence_hashes(
        &prompt,
        BlockSize::try_new(PAGE).unwrap(),
        HashSeed::default(),
    );
    let KvEvent::Stored { blocks, .. } = &published[2] else {
        panic!("{published:?}")
    };
    assert_eq!(blocks[0].seq_hash, want[1], "indexed as the plain page");
    // Anything else in a token's place is still an error: a triple, or a pair of non-integers.
    for bad in [
        Value::Array(vec![Value::from(1), Value::from(2), Value::from(3)]),
        Value::Array(vec![Value::from(1), Value::from("x")]),
    ] {
        let Value::Array(mut items) = stored(H1, None, &page_tokens(0), Some("GPU")) else {
            unreachable!()
        };
        let Value::Array(tokens) = &mut items[3] else {
            unreachable!()
        };
        tokens[0] = bad;
        let payload = Value::Array(vec![
            Value::F64(1.0),
            Value::Array(vec![Value::Array(items)]),
        ]);
        assert!(decode_message(&message(0, &payload)).is_err());
    }
}

/// Newer SGLang mirrors vLLM's whole array: `lora_name` (nil) at 7, the salt in `extra_keys`
/// (8), `group_idx` at 9, and its metadata map further on. Salted pages stay out of the index,
/// and a page of another KV cache group is not taken for the main one.
#[test]
fn the_full_array_layout_reads_salt_and_group() {
    let full = |group: Value, extra_keys: Value| {
        let Value::Array(mut items) = stored(H1, None, &page_tokens(0), Some("GPU")) else {
            unreachable!()
        };
        items.extend([
            Value::Nil,
            extra_keys,
            group,
            Value::Nil,
            Value::Nil,
            Value::Nil,
            Value::Nil,
            Value::Map(vec![(Value::from("cache_salt"), Value::from("tenant-a"))]),
        ]);
        Value::Array(items)
    };
    let salted = Value::Array(vec![Value::Array(vec![Value::from(
        "dynamo-cache-salt:tenant-a",
    )])]);
    let batch = newer_batch(
        0,
        vec![
            full(Value::Nil, salted),
            full(Value::from(1), Value::Nil),
            Value::Array(vec![
                Value::from("BlockRemoved"),
                ints(&[H2]),
                Value::from("GPU"),
                Value::from(1),
            ]),
        ],
    );
    assert!(matches!(
        &batch.events[0],
        VllmEvent::BlockStored {
            hashed_with_extra_keys: true,
            group_idx: None,
            ..
        }
    ));
    assert!(matches!(
        &batch.events[1],
        VllmEvent::BlockStored {
            hashed_with_extra_keys: false,
            group_idx: Some(1),
            ..
        }
    ));
    assert!(matches!(
        &batch.events[2],
        VllmEvent::BlockRemoved {
            group_idx: Some(1),
            ..
        }
    ));
    let stored_blocks: usize = published_by_a_new_feed(batch)
        .into_iter()
        .filter_map(|e| match e {
            KvEvent::Stored { blocks, .. } => Some(blocks.len()),
            _ => None,
        })
        .sum();
    assert_eq!(
        stored_blocks, 0,
        "neither the salted page nor group 1's is indexed"
    );
}

/// What a new worker's feed publishes for its first batch.
fn published_by_a_new_feed(batch: VllmBatch) -> Vec<KvEvent> {
    let mut feed = KvFeed::new(
        WorkerId("sglang-0".into()),
        3,
        MapperConfig::new(BlockSize::try_new(PAGE).unwrap()),
    );
    feed.on_live(batch)
        .into_iter()
        .filter_map(|a| match a {
            FeedAction::Publish(batch) => Some(batch.events),
            FeedAction::RequestReplay { .. } => None,
        })
        .flatten()
        .collect()
}
