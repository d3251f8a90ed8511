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
