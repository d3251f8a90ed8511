//! vLLM events → Switchyard events: chaining, removals, clears, resync, filters.

use crate::common;

use switchyard_adapters::vllm::frame::decode_message;
use switchyard_adapters::vllm::mapper::{HashMapper, Ignored, MapError, MapperConfig, Outcome};
use switchyard_adapters::vllm::{VllmBatch, VllmEvent};
use switchyard_protocol::hash::{sequence_hashes, BlockSize, HashSeed, SequenceHash};
use switchyard_protocol::kv::{EngineBlockId, KvEvent, StoredBlock};

const BS: u32 = 16;

fn bs() -> BlockSize {
    BlockSize::try_new(BS).unwrap()
}

fn mapper() -> HashMapper {
    HashMapper::new(MapperConfig::new(bs()))
}

fn store(hashes: &[u64], parent: Option<u64>, tokens: &[u32]) -> VllmEvent {
    VllmEvent::BlockStored {
        block_hashes: hashes.to_vec(),
        parent,
        token_ids: tokens.to_vec(),
        block_size: BS,
        lora_id: None,
        medium: Some("GPU".into()),
        group_idx: None,
        hashed_with_extra_keys: false,
    }
}

fn remove(hashes: &[u64]) -> VllmEvent {
    VllmEvent::BlockRemoved {
        block_hashes: hashes.to_vec(),
        medium: Some("GPU".into()),
        group_idx: Some(0),
    }
}

/// The Stored event's (parent, seq hashes, engine ids).
fn stored(
    outcome: Result<Outcome, MapError>,
) -> (Option<SequenceHash>, Vec<SequenceHash>, Vec<u64>) {
    match outcome {
        Ok(Outcome::Forward {
            event:
                KvEvent::Stored {
                    parent,
                    parent_block_id,
                    blocks,
                    block_size,
                },
            ..
        }) => {
            assert_eq!(block_size, BS);
            // The parent's engine id comes with its hash (vLLM's id is its block hash).
            assert_eq!(parent_block_id.is_some(), parent.is_some());
            (
                parent,
                blocks.iter().map(|b| b.seq_hash).collect(),
                blocks.iter().map(|b| b.block_id.0).collect(),
            )
        }
        other => panic!("expected a Stored event, got {other:?}"),
    }
}

fn seqs(tokens: &[u32]) -> Vec<SequenceHash> {
    sequence_hashes(tokens, bs(), HashSeed::default())
}

#[test]
fn a_child_in_a_later_event_chains_like_hashing_the_whole_prompt() {
    let prompt = common::tokens(1000, 4 * BS as usize);
    let mut m = mapper();
    let (parent, head, ids) = stored(m.apply(&store(&[101, 102], None, &prompt[..32])));
    assert_eq!(parent, None);
    assert_eq!(ids, [101, 102]);
    let (parent, tail, ids) = stored(m.apply(&store(&[103, 104], Some(102), &prompt[32..])));
    assert_eq!(parent, Some(head[1]));
    assert_eq!(ids, [103, 104]);
    assert_eq!([head, tail].concat(), seqs(&prompt));
    assert_eq!(m.seq_hash(104), Some(seqs(&prompt)[3]));
}

#[test]
fn the_captured_31_block_prompt_gets_switchyards_hashes() {
    let batch = decode_message(&common::fixture("vllm_0.32_block_stored_31_blocks.hex")).unwrap();
    let VllmEvent::BlockStored {
        block_hashes,
        token_ids,
        ..
    } = &batch.events[0]
    else {
        panic!("not a store");
    };
    let bs32 = BlockSize::try_new(32).unwrap();
    let mut m = HashMapper::new(MapperConfig::new(bs32));
    let mapped = m.apply_batch(&batch);
    assert_eq!(mapped.seq, 0);
    assert_eq!(mapped.data_parallel_rank, Some(0));
    let expected: Vec<StoredBlock> = sequence_hashes(token_ids, bs32, HashSeed::default())
        .into_iter()
        .zip(block_hashes)
        .map(|(seq_hash, &h)| StoredBlock {
            seq_hash,
            block_id: EngineBlockId(h),
        })
        .collect();
    assert_eq!(expected.len(), 31);
    assert_eq!(
        mapped.kv_events().collect::<Vec<_>>(),
        [&KvEvent::Stored {
            parent: None,
            parent_block_id: None,
            blocks: expected,
            block_size: 32
        }]
    );
    assert_eq!(m.len(), 31);
}

#[test]
fn the_captured_decode_block_needs_a_resync_on_a_fresh_mapper() {
    let batch = decode_message(&common::fixture("vllm_0.32_block_stored_with_parent.hex")).unwrap();
    let mut m = HashMapper::new(MapperConfig::new(BlockSize::try_new(32).unwrap()));
    let mapped = m.apply_batch(&batch);
    assert!(mapped.resync_needed());
    assert_eq!(
        mapped.outcomes,
        [Ok(Outcome::ResyncNeeded {
            missing_parent: EngineBlockId(4075680988474975667)
        })]
    );
    assert!(m.is_empty());
}

#[test]
fn an_unknown_parent_asks_for_a_resync_and_applies_nothing() {
    let mut m = mapper();
    stored(m.apply(&store(&[1], None, &common::tokens(0, 16))));
    assert_eq!(
        m.apply(&store(&[3], Some(2), &common::tokens(16, 16))),
        Ok(Outcome::ResyncNeeded {
            missing_parent: EngineBlockId(2)
        })
    );
    assert_eq!(m.len(), 1);
    assert_eq!(m.copies(3), 0);
}

#[test]
fn removals_name_blocks_by_vllm_hash() {
    let mut m = mapper();
    stored(m.apply(&store(&[1, 2, 3], None, &common::tokens(0, 48))));
    assert_eq!(
        m.apply(&remove(&[3, 99, 2])),
        Ok(Outcome::Forward {
            event: KvEvent::Removed {
                block_ids: vec![EngineBlockId(3), EngineBlockId(2)]
            },
            medium: Some("GPU".into()),
        })
    );
    assert_eq!(m.len(), 1);
    assert_eq!(m.seq_hash(2), None);
    assert_eq!(
        m.apply(&remove(&[2, 99])),
        Ok(Outcome::Ignored(Ignored::NotIndexed))
    );
    // A removed parent is unknown again: a child of it means events were missed.
    assert!(matches!(
        m.apply(&store(&[4], Some(3), &common::tokens(48, 16))),
        Ok(Outcome::ResyncNeeded { .. })
    ));
}

#[test]
fn clear_forgets_everything() {
    let mut m = mapper();
    stored(m.apply(&store(&[1, 2], None, &common::tokens(0, 32))));
    assert_eq!(
        m.apply(&VllmEvent::AllBlocksCleared),
        Ok(Outcome::Forward {
            event: KvEvent::Cleared,
            medium: None
        })
    );
    assert!(m.is_empty());
    assert_eq!(m.reset(), KvEvent::Cleared);
}

#[test]
fn storing_the_same_block_again_is_idempotent() {
    let t = common::tokens(0, 32);
    let mut m = mapper();
    let first = m.apply(&store(&[1, 2], None, &t));
    let again = m.apply(&store(&[1, 2], None, &t));
    assert_eq!(first, again);
    assert_eq!(m.len(), 2);
    // Re-announcing only the second block, under its parent, gives the same hash too.
    let (_, only_second, _) = stored(m.apply(&store(&[2], Some(1), &t[16..])));
    assert_eq!(only_second, seqs(&t)[1..]);
    assert_eq!(m.len(), 2);
}

#[test]
fn a_removal_reaches_the_index_with_the_last_copy() {
    // A fully cached prompt recomputes its last block: vLLM caches a second copy of it,
    // announces it, and later evicts the copies one at a time.
    let t = common::tokens(0, 32);
    let mut m = mapper();
    stored(m.apply(&store(&[1, 2], None, &t)));
    stored(m.apply(&store(&[2], Some(1), &t[16..])));
    assert_eq!(m.copies(2), 2);
    assert_eq!(
        m.apply(&remove(&[2])),
        Ok(Outcome::Ignored(Ignored::StillCached))
    );
    assert_eq!(m.seq_hash(2), Some(seqs(&t)[1]));
    // The next turn continues from the copy still cached: no resync.
    let (parent, _, _) = stored(m.apply(&store(&[3], Some(2), &common::tokens(32, 16))));
    assert_eq!(parent, Some(seqs(&t)[1]));
    assert_eq!(
        m.apply(&remove(&[2])),
        Ok(Outcome::Forward {
            event: KvEvent::Removed {
                block_ids: vec![EngineBlockId(2)]
            },
            medium: Some("GPU".into()),
        })
    );
    assert_eq!(m.copies(2), 0);
}

#[test]
fn block_size_and_token_count_are_checked() {
    let mut m = mapper();
    let mut wrong_size = store(&[1], None, &common::tokens(0, 32));
    if let VllmEvent::BlockStored { block_size, .. } = &mut wrong_size {
        *block_size = 32;
    }
    assert_eq!(
        m.apply(&wrong_size),
        Err(MapError::BlockSizeMismatch {
            expected: 16,
            got: 32
        })
    );
    assert_eq!(
        m.apply(&store(&[1, 2], None, &common::tokens(0, 20))),
        Err(MapError::TokenCountMismatch {
            blocks: 2,
            block_size: 16,
            tokens: 20
        })
    );
    assert!(m.is_empty());
    assert_eq!(
        m.apply(&store(&[], None, &[])),
        Ok(Outcome::Ignored(Ignored::Empty))
    );
}

#[test]
fn other_groups_and_media_are_ignored() {
    let t = common::tokens(0, 16);
    let mut m = mapper();
    let mut other_group = store(&[1], None, &t);
    let mut cpu = store(&[1], None, &t);
    let mut no_medium = store(&[1], None, &t);
    if let (
        VllmEvent::BlockStored { group_idx, .. },
        VllmEvent::BlockStored { medium, .. },
        VllmEvent::BlockStored { medium: none, .. },
    ) = (&mut other_group, &mut cpu, &mut no_medium)
    {
        *group_idx = Some(1);
        *medium = Some("CPU".into());
        *none = None;
    }
    assert_eq!(
        m.apply(&other_group),
        Ok(Outcome::Ignored(Ignored::OtherGroup { group_idx: 1 }))
    );
    assert_eq!(
        m.apply(&cpu),
        Ok(Outcome::Ignored(Ignored::OtherMedium {
            medium: "CPU".into()
        }))
    );
    assert!(m.is_empty());
    // Older vLLM sends no medium: it counts.
    let (_, hashes, _) = stored(m.apply(&no_medium));
    assert_eq!(hashes, seqs(&t));
    // A CPU-tier eviction of the same hash leaves the GPU block alone.
    let cpu_removal = VllmEvent::BlockRemoved {
        block_hashes: vec![1],
        medium: Some("CPU".into()),
        group_idx: None,
    };
    assert!(matches!(m.apply(&cpu_removal), Ok(Outcome::Ignored(_))));
    assert_eq!(m.copies(1), 1);
}

#[test]
fn lora_and_extra_key_chains_are_remembered_but_not_indexed() {
    let t = common::tokens(0, 48);
    let mut m = mapper();
    let mut lora = store(&[1], None, &t[..16]);
    if let VllmEvent::BlockStored { lora_id, .. } = &mut lora {
        *lora_id = Some(7);
    }
    assert_eq!(m.apply(&lora), Ok(Outcome::Ignored(Ignored::NotTokenKeyed)));
    // Its child has no LoRA marker of its own, but inherits the parent's status, rather
    // than being taken for a missed event.
    assert_eq!(
        m.apply(&store(&[2], Some(1), &t[16..32])),
        Ok(Outcome::Ignored(Ignored::NotTokenKeyed))
    );
    let mut image = store(&[3], None, &t[32..]);
    if let VllmEvent::BlockStored {
        hashed_with_extra_keys,
        ..
    } = &mut image
    {
        *hashed_with_extra_keys = true;
    }
    assert_eq!(
        m.apply(&image),
        Ok(Outcome::Ignored(Ignored::NotTokenKeyed))
    );
    assert_eq!(m.len(), 3);
    assert_eq!(m.seq_hash(2), None);
    assert_eq!(
        m.apply(&remove(&[1, 2, 3])),
        Ok(Outcome::Ignored(Ignored::NotIndexed))
    );
    assert!(m.is_empty());
}

#[test]
fn a_captured_batch_maps_in_order_with_the_rank_passed_through() {
    let run = |name: &str| decode_message(&common::fixture(name)).unwrap();
    let prompt: VllmBatch = run("vllm_0.32_block_stored_31_blocks.hex");
    let evictions: VllmBatch = run("vllm_0.32_removed_then_stored.hex");
    let mut m = HashMapper::new(MapperConfig::new(BlockSize::try_new(32).unwrap()));
    m.apply_batch(&prompt);
    let mapped = m.apply_batch(&evictions);
    assert_eq!(mapped.seq, 5);
    assert_eq!(mapped.data_parallel_rank, Some(0));
    assert_eq!(mapped.outcomes.len(), 29);
    assert!(!mapped.resync_needed());
    // The new prompt starts at the root; its store is the last event forwarded.
    let last = mapped.kv_events().last().unwrap();
    assert!(matches!(last, KvEvent::Stored { parent: None, blocks, .. } if blocks.len() == 31));
    // The 28 evictions are all blocks of the first prompt (checked against the capture).
    for outcome in &mapped.outcomes[..28] {
        assert!(matches!(
            outcome,
            Ok(Outcome::Forward {
                event: KvEvent::Removed { block_ids },
                medium: Some(medium),
            }) if block_ids.len() == 1 && medium == "GPU"
        ));
    }
    assert_eq!(m.len(), 31 - 28 + 31);
}
