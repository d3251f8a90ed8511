//! The streaming client against a tiny real SSE server (warp on 127.0.0.1:0): timing,
//! token counts, headers, the concurrency cap, dependencies, the duration cap, and every kind
//! of failure recorded.

use crate::loadgen_support;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use loadgen_support::{
    start_server, FAIL_IN_STREAM, FAIL_NOT_STREAMED, FAIL_STATUS, FAIL_TRUNCATED, FIRST_TOKEN_MS,
    TOKEN_GAP_MS,
};
use switchyard_loadgen::client::{replay, ClientConfig, ReplayOutcome};
use switchyard_loadgen::prompts::{BodyBuilder, PromptFraming, PromptSpec, Segment};
use switchyard_loadgen::record::RequestRecord;
use switchyard_loadgen::vocab::Vocabulary;
use switchyard_loadgen::{ArrivalScale, PlannedRequest, Workload};
use switchyard_protocol::route::ApiKind;

fn request(
    id: usize,
    arrival_ms: u64,
    osl: u32,
    after: Vec<usize>,
    think_ms: u64,
) -> PlannedRequest {
    PlannedRequest {
        id,
        arrival_ms,
        session: id as u64,
        turn: 0,
        agent: 0,
        after,
        think_ms,
        prompt: PromptSpec {
            segments: vec![Segment {
                block: id as u64,
                tokens: 20 + id as u32,
            }],
        },
        osl,
    }
}

fn workload(requests: Vec<PlannedRequest>) -> Workload {
    Workload {
        name: "test".into(),
        content_seed: 1,
        requests,
    }
}

fn config(addr: SocketAddr) -> ClientConfig {
    ClientConfig {
        endpoint: format!("http://{addr}"),
        arrival_scale: ArrivalScale::PLANNED,
        max_concurrency: None,
        max_duration: None,
        drain: Duration::from_secs(5),
        request_timeout: Some(Duration::from_secs(20)),
        api_key: None,
        run_tag: "test".into(),
        framing: PromptFraming::none(),
        progress: false,
    }
}

async fn run(w: Workload, config: ClientConfig) -> ReplayOutcome {
    let builder = BodyBuilder {
        api: ApiKind::Chat,
        model: "test-model".into(),
        vocab: Vocabulary::synthetic(),
        content_seed: w.content_seed,
    };
    tokio::time::timeout(Duration::from_secs(60), replay(w, builder, config))
        .await
        .expect("replay finishes")
        .expect("replay starts")
}

fn by_id(outcome: &ReplayOutcome, id: usize) -> &RequestRecord {
    outcome.records.iter().find(|r| r.id == id).expect("record")
}

#[tokio::test]
async fn measures_ttft_itl_tokens_and_headers_and_records_every_failure() {
    let (addr, _) = start_server().await;
    let w = workload(vec![
        request(0, 0, 8, vec![], 0),
        request(1, 0, 1, vec![], 0),
        request(2, 0, FAIL_STATUS, vec![], 0),
        request(3, 0, FAIL_IN_STREAM, vec![], 0),
        request(4, 0, FAIL_TRUNCATED, vec![], 0),
        request(5, 0, FAIL_NOT_STREAMED, vec![], 0),
    ]);
    let out = run(w, config(addr)).await;
    assert_eq!((out.records.len(), out.not_sent), (6, 0));

    let r = by_id(&out, 0);
    assert!(r.ok(), "{r:?}");
    let ttft = r.ttft_ms.unwrap();
    assert!(
        ttft >= FIRST_TOKEN_MS as f64,
        "TTFT {ttft} below the server's delay"
    );
    let itl = r.itl_ms().unwrap();
    assert!(
        itl >= TOKEN_GAP_MS as f64,
        "ITL {itl} below the server's gap"
    );
    assert!(r.e2e_ms.unwrap() >= ttft + 7.0 * TOKEN_GAP_MS as f64);
    assert_eq!(
        (r.prompt_tokens, r.completion_tokens, r.cached_tokens),
        (Some(20), Some(8), Some(10))
    );
    assert_eq!((r.expected_prompt_tokens, r.content_chunks), (20, 8));
    assert_eq!(r.route.as_deref(), Some("bypass"));
    assert_eq!(r.worker.as_deref(), Some("sim-0"));

    let single = by_id(&out, 1);
    assert!(single.ok() && single.ttft_ms.is_some() && single.itl_ms().is_none());

    let status = by_id(&out, 2);
    assert_eq!(status.status, Some(503));
    assert!(
        status.error.as_deref().unwrap().contains("no capacity"),
        "{status:?}"
    );
    let in_stream = by_id(&out, 3);
    assert_eq!(in_stream.status, Some(200));
    assert!(
        in_stream.error.as_deref().unwrap().contains("engine died"),
        "{in_stream:?}"
    );
    let truncated = by_id(&out, 4);
    assert!(
        truncated
            .error
            .as_deref()
            .unwrap()
            .contains("ended without"),
        "{truncated:?}"
    );
    assert!(!truncated.ok() && truncated.ttft_ms.is_some());
    let not_streamed = by_id(&out, 5);
    let error = not_streamed.error.as_deref().unwrap();
    assert!(
        error.starts_with(
            "stream: the answer is not an event stream (content-type application/json"
        ),
        "{not_streamed:?}"
    );
    assert!(!not_streamed.ok() && not_streamed.e2e_ms.is_some());
}

#[tokio::test]
async fn a_dead_endpoint_gives_connect_errors_not_silence() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    }; // closed again: nothing listens there
    let out = run(
        workload(vec![
            request(0, 0, 4, vec![], 0),
            request(1, 0, 4, vec![], 0),
        ]),
        config(port),
    )
    .await;
    assert_eq!(out.records.len(), 2);
    for r in &out.records {
        assert!(r.error.as_deref().unwrap().starts_with("connect"), "{r:?}");
        assert_eq!(r.status, None);
    }
}

/// Requests whose arrival times tie (all of them at `--arrival-scale 0`) take the slots in
/// planned order, not in the order the runtime happens to poll their tasks: later turns of a
/// trace sent before earlier ones would change what the cache holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tied_arrivals_take_the_slots_in_planned_order() {
    let (addr, _) = start_server().await;
    let w = workload((0..10).map(|i| request(i, 0, 1, vec![], 0)).collect());
    let out = run(
        w,
        ClientConfig {
            max_concurrency: Some(1),
            arrival_scale: ArrivalScale::new(0.0).expect("0 is a scale"),
            ..config(addr)
        },
    )
    .await;
    let mut sent: Vec<_> = out.records.iter().map(|r| (r.sent_ms, r.id)).collect();
    sent.sort_by(|a, b| a.0.total_cmp(&b.0));
    let order: Vec<_> = sent.iter().map(|&(_, id)| id).collect();
    assert_eq!(order, (0..10).collect::<Vec<_>>());
}

#[tokio::test]
async fn the_concurrency_cap_holds_and_waiting_is_not_ttft() {
    let (addr, state) = start_server().await;
    let w = workload(
        (0..8)
            .map(|i| request(i, 0, 3 + 3 * (i as u32 % 2 + 1), vec![], 0))
            .collect(),
    );
    let out = run(
        w,
        ClientConfig {
            max_concurrency: Some(2),
            ..config(addr)
        },
    )
    .await;
    assert_eq!(out.records.len(), 8);
    assert!(out.records.iter().all(RequestRecord::ok));
    assert_eq!(state.max_in_flight.load(Ordering::SeqCst), 2);
    let waited = out
        .records
        .iter()
        .filter(|r| r.sent_ms - r.ready_ms >= FIRST_TOKEN_MS as f64)
        .count();
    assert!(waited >= 4, "later requests queue for a slot");
}

#[tokio::test]
async fn dependencies_think_time_and_arrival_scale_are_honoured() {
    let (addr, _) = start_server().await;
    // Request 1 follows request 0 after 1 s of think time; request 2 arrives at 2 s. Scaled
    // by 0.1: 100 ms and 200 ms.
    let w = workload(vec![
        request(0, 0, 4, vec![], 0),
        request(1, 0, 4, vec![0], 1_000),
        request(2, 2_000, 4, vec![], 0),
    ]);
    let out = run(
        w,
        ClientConfig {
            arrival_scale: ArrivalScale::new(0.1).unwrap(),
            ..config(addr)
        },
    )
    .await;
    let first = by_id(&out, 0);
    let second = by_id(&out, 1);
    assert!(
        second.sent_ms >= first.done_ms().unwrap() + 100.0,
        "{first:?} {second:?}"
    );
    assert!(by_id(&out, 2).sent_ms >= 200.0);
}

#[tokio::test]
async fn the_duration_cap_stops_sending_and_cuts_streams_after_the_drain() {
    let (addr, _) = start_server().await;
    // Request 0 streams for ~60 + 99·15 ms, longer than cap + drain; request 1 arrives after
    // the cap; request 2 depends on request 1.
    let w = workload(vec![
        request(0, 0, 100, vec![], 0),
        request(1, 10_000, 4, vec![], 0),
        request(2, 0, 4, vec![1], 0),
    ]);
    let cfg = ClientConfig {
        max_duration: Some(Duration::from_millis(200)),
        drain: Duration::from_millis(200),
        ..config(addr)
    };
    let out = run(w, cfg).await;
    assert_eq!((out.records.len(), out.not_sent), (1, 2));
    let cut = by_id(&out, 0);
    assert!(
        cut.error.as_deref().unwrap().starts_with("timeout"),
        "{cut:?}"
    );
    assert!(cut.ttft_ms.is_some() && cut.content_chunks > 0);
}

#[tokio::test]
async fn a_session_trace_is_replayed_closed_loop_over_http() {
    let (addr, _) = start_server().await;
    // Session a: two turns 300 ms apart; its sub-agent s starts 100 ms after a's first turn;
    // a's second turn joins s. Session b arrives at 50 ms on its own. Scaled by 0.5. (Output
    // lengths avoid the ones the test server fails on.)
    let text = r#"{"session_id": "a", "timestamp": 0, "input_length": 30, "output_length": 4, "hash_ids": [0]}
{"session_id": "b", "timestamp": 50, "input_length": 30, "output_length": 6, "hash_ids": [1]}
{"session_id": "s", "parent_session_id": "a", "delay": 100, "input_length": 20, "output_length": 5, "hash_ids": [2]}
{"session_id": "s", "delay": 40, "input_length": 28, "output_length": 7, "hash_ids": [3]}
{"session_id": "a", "delay": 300, "input_length": 40, "output_length": 4, "hash_ids": [4]}"#;
    let w = switchyard_loadgen::trace_file::load_trace_text(text, None, 512, 1)
        .unwrap()
        .workload;
    let planned = w.clone();
    let out = run(
        w,
        ClientConfig {
            arrival_scale: ArrivalScale::new(0.5).unwrap(),
            ..config(addr)
        },
    )
    .await;
    assert_eq!(out.records.len(), 5);
    assert!(out.records.iter().all(|r| r.ok()), "{:?}", out.records);
    let mut dependent = 0;
    for r in &planned.requests {
        let sent = by_id(&out, r.id).sent_ms;
        for &d in &r.after {
            let due = by_id(&out, d).done_ms().unwrap() + r.think_ms as f64 * 0.5;
            assert!(
                sent >= due - 1.0,
                "request {} sent at {sent}, due {due}",
                r.id
            );
            dependent += 1;
        }
    }
    assert_eq!(dependent, 3, "s after a, s after s, a after s");
}
