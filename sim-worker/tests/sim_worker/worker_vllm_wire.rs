//! The simulated worker on vLLM's wire (`--wire vllm`), read with the control plane's own
//! decoder: KV events over ZMQ map to the Switchyard hashes of the prompt's tokens, replay
//! re-sends the buffered batches, `/metrics` has vLLM's names, and nothing goes to NATS.

use crate::worker_support;

use std::time::Duration;

use futures::StreamExt;
use serde_json::json;
use switchyard_adapters::vllm::encode::{EncodeOptions, EventEncoding, HashEncoding};
use switchyard_adapters::vllm::frame::decode_message;
use switchyard_adapters::vllm::mapper::{HashMapper, MapperConfig};
use switchyard_adapters::vllm::replay::{decode_reply, encode_request, ReplayFrame};
use switchyard_adapters::vllm::{VllmBatch, VllmEvent};
use switchyard_protocol::hash::{sequence_hashes, BlockSize, HashSeed, SequenceHash};
use switchyard_protocol::kv::KvEvent;
use switchyard_protocol::route::ApiKind;
use switchyard_protocol::subjects;
use switchyard_protocol::worker::WorkerRole;
use switchyard_sim_worker::{RunningWorker, VllmWireConfig, Wire, WorkerConfig};
use worker_support::{
    chat_body, config, get, metric, metrics_text, post_json, start, tokenizer, CHAT, COMPLETIONS,
};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

/// Every wait of these tests ends by this.
const WAIT: Duration = Duration::from_secs(10);
const BLOCK_SIZE: u32 = 16;

fn vllm_config(id: &str) -> WorkerConfig {
    let mut cfg = config(WorkerRole::Agg, id);
    cfg.engine.block_size = BLOCK_SIZE;
    cfg.heartbeat_interval_ms = 50;
    cfg.load_interval_ms = 50;
    cfg.wire = Wire::Vllm(VllmWireConfig::new(
        "tcp://127.0.0.1:0",
        Some("tcp://127.0.0.1:0".to_owned()),
    ));
    cfg
}

/// A SUB socket that is known to receive. ZMQ drops what a PUB socket sends before a new
/// subscriber's subscription has reached it (the "slow joiner"), and nothing says when it has;
/// so completions of one or two blocks, sharing no block with the tests' chat prompts, are sent
/// until one is heard. Their batches are then drained: each test maps with a fresh mapper.
async fn subscribe(client: &reqwest::Client, w: &RunningWorker) -> SubSocket {
    let mut sub = SubSocket::new();
    let endpoint = w
        .kv_events_endpoint()
        .expect("a vLLM-wire worker has a PUB socket");
    tokio::time::timeout(WAIT, sub.connect(endpoint))
        .await
        .expect("connect in time")
        .expect("connect");
    sub.subscribe("").await.expect("subscribe");
    let deadline = tokio::time::Instant::now() + WAIT;
    for i in 0.. {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the subscription never took"
        );
        let body = json!({"prompt": format!("warm-up {i} ").repeat(8), "max_tokens": 1});
        assert_eq!(post_json(client, w, COMPLETIONS, &body).await.status(), 200);
        if let Ok(message) = tokio::time::timeout(Duration::from_millis(200), sub.recv()).await {
            message.expect("receive");
            break;
        }
    }
    while tokio::time::timeout(Duration::from_millis(200), sub.recv())
        .await
        .is_ok()
    {}
    sub
}

fn frames(message: ZmqMessage) -> Vec<Vec<u8>> {
    message.into_vec().into_iter().map(|b| b.to_vec()).collect()
}

/// Receives batches until the mapper has produced `want` stored blocks.
async fn stored_blocks(
    sub: &mut SubSocket,
    mapper: &mut HashMapper,
    want: usize,
) -> (Vec<VllmBatch>, Vec<SequenceHash>) {
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut batches = Vec::new();
    let mut hashes = Vec::new();
    while hashes.len() < want {
        let message = tokio::time::timeout_at(deadline, sub.recv())
            .await
            .unwrap_or_else(|_| panic!("only {} of {want} blocks announced in time", hashes.len()))
            .expect("receive");
        let batch = decode_message(&frames(message)).expect("a well-formed vLLM message");
        let mapped = mapper.apply_batch(&batch);
        assert!(!mapped.resync_needed(), "{batch:?}");
        for event in mapped.kv_events() {
            if let KvEvent::Stored { blocks, .. } = event {
                hashes.extend(blocks.iter().map(|b| b.seq_hash));
            }
        }
        batches.push(batch);
    }
    (batches, hashes)
}

async fn replay(w: &RunningWorker, from: u64) -> Vec<VllmBatch> {
    let mut dealer = DealerSocket::new();
    let endpoint = w.kv_replay_endpoint().expect("a replay socket");
    tokio::time::timeout(WAIT, dealer.connect(endpoint))
        .await
        .expect("connect in time")
        .expect("connect");
    let request: Vec<bytes::Bytes> = encode_request(from).into_iter().map(Into::into).collect();
    dealer
        .send(ZmqMessage::try_from(request).unwrap())
        .await
        .expect("send the replay request");
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut out = Vec::new();
    loop {
        let message = tokio::time::timeout_at(deadline, dealer.recv())
            .await
            .expect("the replay ends in time")
            .expect("receive");
        match decode_reply(&frames(message)).expect("a well-formed replay answer") {
            ReplayFrame::Batch(batch) => out.push(batch),
            ReplayFrame::End => return out,
        }
    }
}

#[tokio::test]
async fn kv_events_over_zmq_map_to_the_prompt_hashes_and_replay_from_a_seq() {
    let tok = tokenizer();
    // NATS is up and handed to the worker: on vLLM's wire it must stay silent.
    let nats_server = worker_support::NatsServer::start();
    let observer = async_nats::connect(&nats_server.url).await.unwrap();
    let mut everything = observer.subscribe(">").await.unwrap();
    observer.flush().await.unwrap();
    let w = start(vllm_config("agg-vllm"), &tok, Some(&observer)).await;
    let client = reqwest::Client::new();
    let mut sub = subscribe(&client, &w).await;

    let body = chat_body("wire", 120, 3);
    let tokens = tok.tokenize_request(ApiKind::Chat, &body).unwrap();
    let block_size = BlockSize::try_new(BLOCK_SIZE).unwrap();
    let expected = sequence_hashes(&tokens, block_size, HashSeed::default());
    assert!(expected.len() >= 4, "the prompt spans several blocks");
    let resp = post_json(&client, &w, CHAT, &body).await;
    assert_eq!(resp.status(), 200);

    let mut mapper = HashMapper::new(MapperConfig::new(block_size));
    let (live, hashes) = stored_blocks(&mut sub, &mut mapper, expected.len()).await;
    assert_eq!(
        hashes, expected,
        "Switchyard's hashes of the prompt's tokens"
    );
    let first = live[0].seq;
    assert!(first > 0, "the warm-up's batches came first");
    for (i, batch) in live.iter().enumerate() {
        assert_eq!(batch.seq, first + i as u64, "+1 per batch");
        assert_eq!(batch.topic, "kv-events");
        assert_eq!(batch.data_parallel_rank, Some(0));
        assert!(batch.skipped.is_empty(), "{:?}", batch.skipped);
    }
    // The announced token ids are the prompt's full blocks, as vLLM reports them.
    let announced: Vec<u32> = live
        .iter()
        .flat_map(|b| &b.events)
        .filter_map(|e| match e {
            VllmEvent::BlockStored { token_ids, .. } => Some(token_ids.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(announced, tokens[..expected.len() * BLOCK_SIZE as usize]);

    // Replay from 0 re-sends everything since the start, numbered from 0; from the first
    // live batch, exactly what was seen live.
    let replayed = replay(&w, 0).await;
    assert_eq!(replayed[0].seq, 0, "vLLM numbers batches from 0");
    assert!(replayed.windows(2).all(|p| p[1].seq == p[0].seq + 1));
    assert_eq!(replayed[replayed.len() - live.len()..], live[..]);
    assert_eq!(replay(&w, first).await, live);

    // Load in vLLM's names, with sane values once the request is done.
    let text = metrics_text(&client, &w).await;
    assert_parses_as_prometheus_text(&text);
    assert_eq!(
        metric(&text, "vllm:num_requests_running", Some("model_name=")),
        0.0
    );
    assert_eq!(
        metric(&text, "vllm:num_requests_waiting", Some("model_name=")),
        0.0
    );
    let usage = metric(&text, "vllm:kv_cache_usage_perc", None);
    assert!((0.0..=1.0).contains(&usage), "{usage}");
    let info = metric(
        &text,
        "vllm:cache_config_info",
        Some(&format!("block_size=\"{BLOCK_SIZE}\"")),
    );
    assert_eq!(info, 1.0);
    assert!(text.contains("num_gpu_blocks=\""), "{text}");
    assert!(metric(&text, "vllm:prefix_cache_queries_total", None) >= tokens.len() as f64);
    assert_eq!(
        metric(
            &text,
            "vllm:prompt_tokens_by_source_total",
            Some("local_compute")
        ),
        metric(&text, "vllm:prompt_tokens_total", None),
        "no prompt shared a block with another: every prompt token was computed here"
    );
    assert_eq!(
        metric(
            &text,
            "vllm:prompt_tokens_by_source_total",
            Some("local_cache_hit")
        ),
        0.0
    );
    assert_eq!(
        metric(&text, "switchyard_kv_replay_requests_total", None),
        2.0
    );
    assert_eq!(get(&client, &w, "/health").await.status(), 200);

    // Not one message on NATS: no registration, heartbeats, load reports or KV subjects.
    let quiet = tokio::time::timeout(Duration::from_millis(300), everything.next()).await;
    assert!(
        quiet.is_err(),
        "unexpected NATS message: {:?}",
        quiet.ok().flatten().map(|m| m.subject)
    );
    let _ = subjects::HEARTBEAT; // the subject a Switchyard-wire worker would have used
}

#[tokio::test]
async fn a_repeated_prompt_is_not_announced_twice_and_evictions_are() {
    let tok = tokenizer();
    let mut cfg = vllm_config("agg-vllm-evict");
    // Room for one prompt only: the second prompt evicts the first one's blocks.
    cfg.engine.kv_capacity_blocks = 12;
    cfg.max_model_len = 12 * BLOCK_SIZE;
    let w = start(cfg, &tok, None).await;
    let client = reqwest::Client::new();
    let mut sub = subscribe(&client, &w).await;
    let block_size = BlockSize::try_new(BLOCK_SIZE).unwrap();
    let mut mapper = HashMapper::new(MapperConfig::new(block_size));

    let first = chat_body("first", 40, 1);
    let first_tokens = tok.tokenize_request(ApiKind::Chat, &first).unwrap();
    let first_blocks = sequence_hashes(&first_tokens, block_size, HashSeed::default());
    assert!(
        first_blocks.len() >= 3 && first_blocks.len() <= 10,
        "{}",
        first_blocks.len()
    );
    assert_eq!(post_json(&client, &w, CHAT, &first).await.status(), 200);
    let (_, hashes) = stored_blocks(&mut sub, &mut mapper, first_blocks.len()).await;
    assert_eq!(hashes, first_blocks);

    let second = chat_body("other", 40, 1);
    let second_tokens = tok.tokenize_request(ApiKind::Chat, &second).unwrap();
    let second_blocks = sequence_hashes(&second_tokens, block_size, HashSeed::default());
    assert_eq!(post_json(&client, &w, CHAT, &second).await.status(), 200);
    let (batches, hashes) = stored_blocks(&mut sub, &mut mapper, second_blocks.len()).await;
    // The shared chat-template prefix is cached, so only the new blocks are announced.
    assert_eq!(
        hashes[..],
        second_blocks[second_blocks.len() - hashes.len()..]
    );
    let removed = batches
        .iter()
        .flat_map(|b| &b.events)
        .filter(|e| matches!(e, VllmEvent::BlockRemoved { .. }))
        .count();
    assert!(removed > 0, "a full cache evicts: {batches:?}");
    // Every removal named a block the mapper knew (it forwards or counts copies).
    assert!(mapper.len() <= 12);
}

#[tokio::test]
async fn older_array_events_with_byte_hashes_map_the_same() {
    let tok = tokenizer();
    let mut cfg = vllm_config("agg-vllm-array");
    if let Wire::Vllm(vllm) = &mut cfg.wire {
        vllm.encoding = EncodeOptions {
            events: EventEncoding::Array,
            hashes: HashEncoding::Bytes,
        };
        vllm.topic = String::new();
    }
    let w = start(cfg, &tok, None).await;
    let client = reqwest::Client::new();
    let mut sub = subscribe(&client, &w).await;
    let body = chat_body("array", 60, 1);
    let tokens = tok.tokenize_request(ApiKind::Chat, &body).unwrap();
    let block_size = BlockSize::try_new(BLOCK_SIZE).unwrap();
    let expected = sequence_hashes(&tokens, block_size, HashSeed::default());
    assert_eq!(post_json(&client, &w, CHAT, &body).await.status(), 200);
    let mut mapper = HashMapper::new(MapperConfig::new(block_size));
    let (live, hashes) = stored_blocks(&mut sub, &mut mapper, expected.len()).await;
    assert_eq!(hashes, expected);
    assert_eq!(live[0].topic, "");
}

/// Every line is a `# HELP`/`# TYPE` comment or `name{labels} value` with a number, and every
/// sample carries the `model_name` label vLLM's scrapers select by.
fn assert_parses_as_prometheus_text(text: &str) {
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{line}"));
        assert!(value.parse::<f64>().is_ok(), "not a number: {line}");
        let (name, labels) = series.split_once('{').unwrap_or_else(|| panic!("{line}"));
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "{line}"
        );
        assert!(
            labels.ends_with('}') && labels.contains("model_name=\""),
            "{line}"
        );
    }
}
