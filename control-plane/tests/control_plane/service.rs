//! The service end to end over real HTTP and a real nats-server: worker registration and
//! expiry, routing to live decode workers, malformed messages, bad route bodies, resync
//! requests, EDS and start-up without NATS.

use crate::common;

use std::time::Duration;

use common::*;
use futures::StreamExt;
use serde_json::json;
use switchyard_control_plane::settings::Settings;
use switchyard_protocol::kv::ResyncRequest;
use switchyard_protocol::registration::RegistrationSecret;
use switchyard_protocol::route::{ApiError, RouteMode, Verdict};
use switchyard_protocol::subjects;
use switchyard_protocol::worker::{WorkerHeartbeat, WorkerRole};

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_register_a_worker_that_expires_when_they_stop() {
    let (_server, svc, nats) = service_with_nats(Settings::for_tests()).await;
    let decode = worker("decode-0", WorkerRole::Decode, 9001, 1);

    register(&svc, &nats, &decode, 300).await;
    let m = svc.metrics().await;
    assert_metric(&m, "switchyard_live_workers{role=\"decode\"}", 1.0);

    // No more heartbeats: expired after 3 missed 300 ms intervals (no longer listed as soon
    // as its window ends; counted when the sweep removes it).
    eventually(WAIT, "decode-0 expired", || async {
        svc.worker_ids().await.is_empty()
            && metric_value(&svc.metrics().await, "switchyard_workers_expired_total") == 1.0
    })
    .await;
    let m = svc.metrics().await;
    assert_metric(&m, "switchyard_workers_expired_total", 1.0);
    assert_metric(&m, "switchyard_live_workers{role=\"decode\"}", 0.0);
    svc.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_picks_a_live_decode_worker_and_503s_without_one() {
    let (_server, svc, nats) = service_with_nats(Settings::for_tests()).await;

    let resp = route(&svc.base, "chat", Some("r-0"), chat("hello")).await;
    assert_eq!(resp.status(), 503);
    let err: ApiError = resp.json().await.unwrap();
    assert_eq!(err.code, "no_workers");

    register_worker(&svc, &nats, "prefill-0", WorkerRole::Prefill, 9100).await;
    register_worker(&svc, &nats, "decode-0", WorkerRole::Decode, 9001).await;

    let resp = route(&svc.base, "chat", Some("r-1"), chat("hello there")).await;
    assert_eq!(resp.status(), 200);
    let verdict: Verdict = resp.json().await.unwrap();
    assert_eq!(verdict.request_id, "r-1");
    assert_eq!(verdict.decode.worker_id.0, "decode-0");
    assert_eq!(verdict.decode.address, "127.0.0.1:9001");
    assert!(verdict.isl > 0, "the prompt was tokenized: {verdict:?}");
    if verdict.mode == RouteMode::Disagg {
        assert_eq!(verdict.prefill.as_ref().unwrap().worker_id.0, "prefill-0");
    }

    // Without x-request-id one is made up; completions work too.
    let body = json!({"model": "qwen3", "prompt": "Once upon a time"}).to_string();
    let resp = route(&svc.base, "completions", None, body).await;
    assert_eq!(resp.status(), 200);
    let verdict: Verdict = resp.json().await.unwrap();
    assert!(
        verdict.request_id.starts_with("sy-"),
        "{}",
        verdict.request_id
    );

    let m = svc.metrics().await;
    assert_metric(
        &m,
        "switchyard_route_bad_requests_total{code=\"no_workers\"}",
        1.0,
    );
    assert!(m.contains("switchyard_route_decisions_total{mode="), "{m}");
    assert_eq!(
        metric_value(&m, "switchyard_route_latency_seconds_count"),
        2.0,
        "the two verdicts, not the refusal: {m}"
    );
    svc.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_shows_the_verdict_and_decides_nothing() {
    let (_server, svc, nats) = service_with_nats(Settings::for_tests()).await;
    register_worker(&svc, &nats, "decode-0", WorkerRole::Decode, 9001).await;
    let prompt = chat(&"A prompt of several blocks, asked about twice. ".repeat(40));
    let call = |query: &'static str, id: &'static str| {
        reqwest::Client::new()
            .post(format!("{}/v1/route{query}", svc.base))
            .header(switchyard_protocol::route::API_HEADER, "chat")
            .header(switchyard_protocol::route::REQUEST_ID_HEADER, id)
            .body(prompt.clone())
            .send()
    };
    let shown = |resp: reqwest::Response| async move {
        assert_eq!(resp.status(), 200);
        assert_eq!(
            resp.headers()
                .get("x-switchyard-dry-run")
                .map(|v| v.as_bytes()),
            Some(&b"true"[..])
        );
        resp.json::<Verdict>().await.unwrap()
    };

    // Twice in a row: the first booked nothing, so the second sees no predicted cache.
    let first = shown(call("?dry_run=true", "look-1").await.unwrap()).await;
    let second = shown(call("?dry_run=1", "look-2").await.unwrap()).await;
    assert_eq!(first.decode.worker_id.0, "decode-0");
    assert!(first.isl > 32, "{first:?}");
    assert_eq!((first.cached_tokens, second.cached_tokens), (0, 0));
    let m = svc.metrics().await;
    assert_metric(&m, "switchyard_route_dry_runs_total", 2.0);
    let decisions: f64 = m
        .lines()
        .filter(|l| l.starts_with("switchyard_route_decisions_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(decisions, 0.0, "{m}");
    assert_eq!(
        metric_value(&m, "switchyard_route_latency_seconds_count"),
        0.0
    );
    let in_flight =
        "switchyard_worker_in_flight{worker=\"decode-0\",role=\"decode\",model=\"qwen3\"}";
    assert_eq!(metric_value(&m, in_flight), 0.0, "{m}");
    // Without an id, a dry run's verdict says what it is and draws none of the made-up ids.
    let anonymous = reqwest::Client::new()
        .post(format!("{}/v1/route?dry_run=true", svc.base))
        .header(switchyard_protocol::route::API_HEADER, "chat")
        .body(prompt.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(shown(anonymous).await.request_id, "dry-run");

    // A decision (no query, or dry_run=false) books the request and predicts its blocks
    // cached, which the next dry run shows.
    let decided = call("?dry_run=false", "real").await.unwrap();
    assert_eq!(decided.status(), 200);
    assert!(decided.headers().get("x-switchyard-dry-run").is_none());
    let after = shown(call("?dry_run=true", "look-3").await.unwrap()).await;
    assert!(after.cached_tokens > 0, "{after:?}");
    // One request in flight: the decision, not the three dry runs.
    eventually(WAIT, "the decision counted in flight", || async {
        metric_value(&svc.metrics().await, in_flight) == 1.0
    })
    .await;
    let m = svc.metrics().await;
    assert_metric(&m, "switchyard_route_dry_runs_total", 4.0);

    // Anything else in the query is refused, not ignored: a misspelt dry run decides nothing.
    for (query, mentions) in [("?dry_run=maybe", "maybe"), ("?dryrun=true", "dryrun")] {
        let resp = call(query, "bad").await.unwrap();
        assert_eq!(resp.status(), 400, "{query}");
        let err: ApiError = resp.json().await.unwrap();
        assert_eq!(err.code, "bad_query");
        assert!(err.message.contains(mentions), "{}", err.message);
    }
    let m = svc.metrics().await;
    assert_metric(
        &m,
        "switchyard_route_bad_requests_total{code=\"bad_query\"}",
        2.0,
    );
    assert_eq!(metric_value(&m, in_flight), 1.0, "{m}");
    svc.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_open_report_makes_only_its_own_route_call_late() {
    let (_server, svc, nats) = service_with_nats(Settings::for_tests()).await;
    register_worker(&svc, &nats, "decode-0", WorkerRole::Decode, 9001).await;
    let numbered = |call: &str| {
        reqwest::Client::new()
            .post(format!("{}/v1/route", svc.base))
            .header(switchyard_protocol::route::API_HEADER, "chat")
            .header(switchyard_protocol::route::REQUEST_ID_HEADER, "dup")
            .header(switchyard_protocol::route::ROUTE_CALL_HEADER, call)
            .body(chat("same id twice"))
            .send()
    };
    // Call 1 of "dup" was failed open (its client left) before the control plane read it.
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/lifecycle", svc.base))
        .json(&json!({"v": 1, "events": [
            {"event": "done", "request_id": "dup", "ok": false, "failed_open": true,
             "route_call": 1}
        ]}))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    // The client's retry reuses the id: call 2, a new request, counted in flight.
    assert_eq!(numbered("2").await.unwrap().status(), 200);
    let in_flight = |m: &str| {
        metric_value(
            m,
            "switchyard_worker_in_flight{worker=\"decode-0\",role=\"decode\",model=\"qwen3\"}",
        )
    };
    eventually(WAIT, "the retry counted", || async {
        in_flight(&svc.metrics().await) == 1.0
    })
    .await;
    // Call 1 comes late: answered, not counted.
    assert_eq!(numbered("1").await.unwrap().status(), 200);
    eventually(WAIT, "call 1 counted late", || async {
        metric_value(&svc.metrics().await, "switchyard_late_route_calls_total") == 1.0
    })
    .await;
    let m = svc.metrics().await;
    assert_eq!(in_flight(&m), 1.0, "{m}");
    svc.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_nats_messages_are_counted_and_harmless() {
    let (_server, svc, nats) = service_with_nats(Settings::for_tests()).await;
    // Let the consumer subscribe before publishing (core NATS does not buffer).
    let probe = register_worker(&svc, &nats, "probe", WorkerRole::Decode, 9009).await;

    for (subject, payload) in [
        (subjects::HEARTBEAT.to_string(), "not json".to_string()),
        (
            subjects::HEARTBEAT.to_string(),
            json!({"v": 1, "worker": {"worker_id": 5}}).to_string(),
        ),
        // A valid heartbeat written as an array: serde alone would read it field by field.
        (
            subjects::HEARTBEAT.to_string(),
            json!([1, worker("positional", WorkerRole::Decode, 9014, 1), 60_000]).to_string(),
        ),
        (subjects::LOAD.to_string(), "{".to_string()),
        // Well-formed but impossible: u64::MAX blocks in use wrapped the router's sums around
        // and made a full worker look empty.
        (
            subjects::LOAD.to_string(),
            json!({"v": 1, "worker_id": "probe", "running": 0, "waiting": 0,
                   "kv_used_blocks": u64::MAX, "kv_total_blocks": 1000,
                   "queued_prefill_tokens": 0})
            .to_string(),
        ),
        (
            subjects::kv_events(&probe.worker_id),
            json!({"events": "x"}).to_string(),
        ),
        // A batch claiming another worker's identity on this worker's subject.
        (
            subjects::kv_events(&probe.worker_id),
            json!({"worker_id": "other", "instance_id": 1, "seq": 1, "events": []}).to_string(),
        ),
        // The same for a load report and a heartbeat on the probe's own subjects.
        (
            subjects::load(&probe.worker_id),
            json!({"v": 1, "worker_id": "other", "running": 0, "waiting": 0,
                   "kv_used_blocks": 1000, "kv_total_blocks": 1000})
            .to_string(),
        ),
        (
            subjects::heartbeat(&probe.worker_id),
            serde_json::to_string(&WorkerHeartbeat {
                v: 1,
                worker: worker("other", WorkerRole::Decode, 9017, 1),
                interval_ms: 1_000,
                sent_at_ms: 0,
                signature: None,
            })
            .unwrap(),
        ),
    ] {
        nats.publish(subject, payload.into()).await.unwrap();
    }
    // Well-formed but refused: a block size of 0 cannot cut prompts into blocks.
    let mut broken = worker("broken", WorkerRole::Decode, 9010, 1);
    broken.block_size = 0;
    heartbeat(&nats, &broken, 60_000).await;
    // So are workers the pools cannot hold: a host name Envoy's endpoints cannot take, an id
    // that is no NATS subject token, an interval that would keep a silent worker for ever.
    let mut named = worker("named", WorkerRole::Decode, 9011, 1);
    named.address = "localhost:9011".into();
    heartbeat(&nats, &named, 1_000).await;
    heartbeat(&nats, &worker("bad.id", WorkerRole::Decode, 9012, 1), 1_000).await;
    heartbeat(
        &nats,
        &worker("forever", WorkerRole::Decode, 9013, 1),
        u64::MAX,
    )
    .await;
    // A model name that would forge series in the Prometheus exposition.
    let mut forger = worker("forger", WorkerRole::Decode, 9016, 1);
    forger.model = "m\"} 1\nswitchyard_forged 42\n#".into();
    heartbeat(&nats, &forger, 1_000).await;
    // A second id at the live probe's address (one address is one engine).
    heartbeat(&nats, &worker("twin", WorkerRole::Decode, 9009, 1), 1_000).await;
    // A second process under the live probe's id, at another address.
    heartbeat(&nats, &worker("probe", WorkerRole::Decode, 9015, 2), 1_000).await;
    nats.flush().await.unwrap();

    eventually(WAIT, "bad messages counted", || async {
        let m = svc.metrics().await;
        metric_value(&m, "switchyard_bad_messages_total{kind=\"heartbeat\"}") == 4.0
            && metric_value(&m, "switchyard_bad_messages_total{kind=\"load\"}") == 3.0
            && metric_value(&m, "switchyard_bad_messages_total{kind=\"kv_events\"}") == 2.0
            && metric_value(&m, "switchyard_workers_rejected_total{reason=\"invalid\"}") == 5.0
            && metric_value(
                &m,
                "switchyard_workers_rejected_total{reason=\"address_in_use\"}",
            ) == 1.0
            && metric_value(
                &m,
                "switchyard_workers_rejected_total{reason=\"id_in_use\"}",
            ) == 1.0
    })
    .await;
    let ids = svc.worker_ids().await;
    assert!(
        !svc.metrics().await.contains("switchyard_forged"),
        "no forged series"
    );
    for refused in [
        "broken",
        "named",
        "bad.id",
        "forever",
        "positional",
        "twin",
        "forger",
    ] {
        assert!(!ids.contains(&refused.to_string()), "{refused} in {ids:?}");
    }

    // Still alive: a new worker registers and routing works.
    register_worker(&svc, &nats, "decode-1", WorkerRole::Decode, 9002).await;
    assert_eq!(
        route(&svc.base, "chat", None, chat("still there?"))
            .await
            .status(),
        200
    );
    svc.stop().await;
}

async fn next(resyncs: &mut async_nats::Subscriber) -> ResyncRequest {
    let msg = tokio::time::timeout(WAIT, resyncs.next())
        .await
        .expect("a resync request")
        .unwrap();
    serde_json::from_slice(&msg.payload).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_and_restarted_workers_are_asked_for_a_kv_resync() {
    let (_server, svc, nats) = service_with_nats(Settings::for_tests()).await;
    let decode = worker("decode-7", WorkerRole::Decode, 9007, 1);
    let mut resyncs = nats
        .subscribe(subjects::kv_resync(&decode.worker_id))
        .await
        .unwrap();
    nats.flush().await.unwrap();

    register(&svc, &nats, &decode, 60_000).await;
    let req = next(&mut resyncs).await;
    assert_eq!(req.worker_id, decode.worker_id);
    assert_eq!(req.reason, "new_worker");

    // Refreshes ask for nothing; a new instance (restart) does.
    heartbeat(&nats, &decode, 60_000).await;
    let restarted = worker("decode-7", WorkerRole::Decode, 9007, 2);
    heartbeat(&nats, &restarted, 60_000).await;
    let req = next(&mut resyncs).await;
    assert_eq!(req.reason, "restarted");

    // Counted right after publishing, so the test may see the message first.
    eventually(WAIT, "resyncs counted", || async {
        let m = svc.metrics().await;
        metric_value(
            &m,
            "switchyard_resync_requests_total{reason=\"new_worker\"}",
        ) == 1.0
            && metric_value(&m, "switchyard_resync_requests_total{reason=\"restarted\"}") == 1.0
    })
    .await;
    svc.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_serves_while_nats_is_down_and_catches_up_when_it_comes() {
    let port = free_port();
    let url = format!("nats://127.0.0.1:{port}");
    let svc = Service::start(Settings::for_tests(), tokenizer(), &url).await;

    let health = svc.get_json("/healthz").await;
    assert_eq!(health["status"], "ok");
    assert_ne!(health["nats"], "connected");
    let resp = route(&svc.base, "chat", None, chat("anyone?")).await;
    assert_eq!(resp.status(), 503, "no workers known yet, answered at once");

    let nats_server = NatsServer::start_on(port);
    let nats = client(&nats_server.url).await;
    let decode = worker("decode-0", WorkerRole::Decode, 9001, 1);
    eventually(
        Duration::from_secs(30),
        "registered after NATS came up",
        || async {
            heartbeat(&nats, &decode, 60_000).await;
            !svc.worker_ids().await.is_empty()
        },
    )
    .await;
    assert_eq!(svc.get_json("/healthz").await["nats"], "connected");
    assert_eq!(
        route(&svc.base, "chat", None, chat("now?")).await.status(),
        200
    );
    svc.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_registrations_signed_with_the_secret_join_and_spoofs_are_counted() {
    let dir = TempDir::new("cp-secret").unwrap();
    let secret_file = dir.path().join("secret");
    std::fs::write(&secret_file, "0123456789abcdef-test-secret\n").unwrap();
    let secret = RegistrationSecret::new("0123456789abcdef-test-secret").unwrap();
    let mut settings = Settings::for_tests();
    settings.registration.registration_secret_file = Some(secret_file);
    let (_server, svc, nats) = service_with_nats(settings).await;

    // The real worker, signed.
    let real = worker("decode-0", WorkerRole::Decode, 9001, 1);
    eventually(WAIT, "the signed worker registered", || async {
        let sent = unix_now_ms();
        publish_heartbeat(&nats, &signed(&secret, &real, sent)).await;
        svc.worker_ids().await.contains(&"decode-0".to_string())
    })
    .await;

    // A stray publisher: unsigned, signed with another secret, a recorded signature moved to
    // its own address, and a recording replayed too late.
    let spoof = worker("evil", WorkerRole::Decode, 18999, 1);
    let other = RegistrationSecret::new("not-the-deployment-secret").unwrap();
    let now = unix_now_ms();
    heartbeat(&nats, &spoof, 60_000).await;
    publish_heartbeat(&nats, &signed(&other, &spoof, now)).await;
    let mut moved = signed(&secret, &real, now);
    moved.worker = spoof.clone();
    publish_heartbeat(&nats, &moved).await;
    let old = now - 10 * 60_000;
    publish_heartbeat(&nats, &signed(&secret, &spoof, old)).await;
    eventually(WAIT, "every spoof counted", || async {
        let m = svc.metrics().await;
        metric_value(&m, "switchyard_workers_rejected_total{reason=\"unsigned\"}") == 1.0
            && metric_value(
                &m,
                "switchyard_workers_rejected_total{reason=\"bad_signature\"}",
            ) == 2.0
            && metric_value(&m, "switchyard_workers_rejected_total{reason=\"stale\"}") == 1.0
    })
    .await;
    assert_eq!(svc.worker_ids().await, ["decode-0"], "no spoof joined");
    let verdict: Verdict = route(&svc.base, "chat", None, chat("who serves me?"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(verdict.decode.address, "127.0.0.1:9001");
    svc.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_secret_or_the_development_flag_no_worker_joins() {
    let mut settings = Settings::for_tests();
    // As the binary starts by default: neither a secret nor --allow-unsigned-registrations.
    settings.registration.registration_secret_file = Some("/nonexistent".into());
    assert!(
        switchyard_bus::RegistrationArgs::default()
            .secret()
            .unwrap()
            .is_none(),
        "the default has no secret"
    );
    let server = NatsServer::start();
    let nats = client(&server.url).await;
    let err = switchyard_control_plane::service::run_with_tokenizer(
        settings,
        tokenizer(),
        loopback_listeners().await,
        nats,
        Box::pin(async {}),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("/nonexistent"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_outage_expires_no_worker_and_expiry_resumes_after_a_window() {
    let mut server = NatsServer::start();
    let svc = Service::start(Settings::for_tests(), tokenizer(), &server.url).await;
    let nats = client(&server.url).await;
    // A control plane that was ready (EDS waits for that) when NATS goes away.
    eventually(Duration::from_secs(5), "ready", || async {
        svc.get_json("/readyz").await["ready"] == true
    })
    .await;
    // Heartbeats every 200 ms: expired 600 ms after the last one.
    let a = worker("decode-0", WorkerRole::Decode, 9001, 1);
    let b = worker("decode-1", WorkerRole::Decode, 9002, 1);
    register(&svc, &nats, &a, 200).await;
    register(&svc, &nats, &b, 200).await;

    server.stop(Duration::from_secs(2));
    assert_ne!(svc.get_json("/healthz").await["nats"], "connected");
    // Four times the expiry window without a heartbeat: nobody is expired, EDS keeps both.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let mut ids = svc.worker_ids().await;
    ids.sort();
    assert_eq!(ids, ["decode-0", "decode-1"]);
    let eds: serde_json::Value = reqwest::Client::new()
        .post(format!("{}/v3/discovery:endpoints", svc.base))
        .json(&json!({"resource_names": ["switchyard_decode"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let endpoints = &eds["resources"][0]["endpoints"][0]["lb_endpoints"];
    assert_eq!(endpoints.as_array().map(Vec::len), Some(2), "{eds}");
    assert_eq!(
        route(&svc.base, "chat", None, chat("still routed?"))
            .await
            .status(),
        200
    );

    // NATS returns; only decode-0 heartbeats again. decode-1 gets one full window from the
    // reconnection, then goes.
    server.restart(Duration::from_secs(10)).unwrap();
    let nats = client(&server.url).await;
    eventually(WAIT, "reconnected", || async {
        svc.get_json("/healthz").await["nats"] == "connected"
    })
    .await;
    let beats = tokio::spawn({
        let nats = nats.clone();
        async move {
            for _ in 0..40 {
                heartbeat(&nats, &a, 200).await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });
    eventually(WAIT, "decode-1 expired after its window", || async {
        svc.worker_ids().await == ["decode-0"]
            && metric_value(&svc.metrics().await, "switchyard_workers_expired_total") == 1.0
    })
    .await;
    beats.abort();
    assert_metric(
        &svc.metrics().await,
        "switchyard_workers_expired_total",
        1.0,
    );
    svc.stop().await;
}

/// `info`'s heartbeat sent at `sent_at_ms`, signed with `secret`.
fn signed(
    secret: &RegistrationSecret,
    info: &switchyard_protocol::worker::WorkerInfo,
    sent_at_ms: u64,
) -> WorkerHeartbeat {
    WorkerHeartbeat {
        v: 1,
        worker: info.clone(),
        interval_ms: 60_000,
        sent_at_ms,
        signature: Some(secret.sign(info, sent_at_ms)),
    }
}
