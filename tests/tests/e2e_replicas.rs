//! Two control-plane replicas serve one gateway (active-active), on a real stack: Envoy with
//! the filter balancing route calls across both, nats-server with JetStream, simulated
//! workers.
//!
//! - A burst that Envoy splits across the replicas spreads across the decode workers as one
//!   replica would spread it, and both replicas see the same load (each applies the other's
//!   decisions and lifecycle reports).
//! - One `PUT /v1/config` on either replica changes the config of both, with one version.
//! - Drill: one replica killed under streaming load fails no request; started again, it says
//!   not ready (and Envoy sends it no route calls) until it has the workers' KV dumps, and then
//!   holds the same index as the replica that stayed.
//!
//! Needs `cargo build -p switchyard-filter --target wasm32-wasip1 --profile wasm && cargo
//! build --workspace --bins` first (the tests build nothing).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};
use switchyard_e2e::browser::Chromium;
use switchyard_e2e::drill::{self, DrillLoad};
use switchyard_e2e::probe::long_prompt;
use switchyard_e2e::{
    client, eventually_ok, get_text, replica_admin_get_json, start_stack,
    DESTINATION_RESPONSE_HEADER,
};
use switchyard_protocol::route::ROUTE_HEADER;
use switchyard_stack::envoy::healthy_hosts;
use switchyard_stack::{Component, ServingMode, Stack, StackBuilder};
use switchyard_support::TempDir;

/// Per decode worker: requests in flight as one replica sees them.
async fn in_flight(http: &reqwest::Client, stack: &Stack, replica: usize) -> BTreeMap<String, u64> {
    let json = replica_admin_get_json(http, stack, replica, "/v1/workers")
        .await
        .unwrap_or_default();
    workers(&json)
        .filter(|w| w["info"]["role"] == "decode")
        .map(|w| (id(w), w["in_flight"].as_u64().unwrap_or(0)))
        .collect()
}

/// Per worker: KV blocks one replica's index holds.
async fn cached_blocks(
    http: &reqwest::Client,
    stack: &Stack,
    replica: usize,
) -> BTreeMap<String, u64> {
    let json = replica_admin_get_json(http, stack, replica, "/v1/workers")
        .await
        .unwrap_or_default();
    workers(&json)
        .map(|w| (id(w), w["cached_blocks"].as_u64().unwrap_or(0)))
        .collect()
}

fn workers(json: &Value) -> impl Iterator<Item = &Value> {
    json["workers"].as_array().into_iter().flatten()
}

fn id(worker: &Value) -> String {
    worker["info"]["worker_id"]
        .as_str()
        .unwrap_or("?")
        .to_string()
}

/// `GET /v1/config` on one replica, or `PUT` with `patch` (made only on the version
/// `if_match` names, if given): the status, the config (or error) and its version (`ETag`).
async fn config_call(
    http: &reqwest::Client,
    stack: &Stack,
    replica: usize,
    patch: Option<Value>,
    if_match: Option<&str>,
) -> (u16, Value, String) {
    let url = format!(
        "{}/v1/config",
        stack.control_plane_replica_admin_url(replica)
    );
    let mut request = match &patch {
        Some(patch) => http.put(&url).json(patch),
        None => http.get(&url),
    };
    if let Some(tag) = if_match {
        request = request.header("if-match", tag);
    }
    let response = request
        .bearer_auth(stack.control_plane_admin_token())
        .send()
        .await
        .expect("/v1/config answers");
    let status = response.status().as_u16();
    let etag = response
        .headers()
        .get("etag")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    (status, response.json().await.unwrap_or_default(), etag)
}

/// `GET /v1/config` on one replica: the config and its version.
async fn config(http: &reqwest::Client, stack: &Stack, replica: usize) -> (Value, String) {
    let (_, config, etag) = config_call(http, stack, replica, None, None).await;
    (config, etag)
}

async fn put_config(
    http: &reqwest::Client,
    stack: &Stack,
    replica: usize,
    patch: Value,
) -> (u16, Value, String) {
    config_call(http, stack, replica, Some(patch), None).await
}

/// The route ports of the control-plane replicas Envoy's health check passes.
async fn healthy_replicas(http: &reqwest::Client, stack: &Stack) -> Vec<String> {
    let page = get_text(http, &format!("{}/clusters", stack.admin_url()))
        .await
        .unwrap_or_default();
    healthy_hosts(&page, "switchyard_control_plane")
}

/// Waits (at most `limit`) until Envoy's health check passes both replicas.
async fn wait_both_healthy(http: &reqwest::Client, stack: &Stack, what: &str, limit: Duration) {
    eventually_ok(what, limit, || async {
        let healthy = healthy_replicas(http, stack).await;
        (healthy.len() == 2)
            .then_some(())
            .ok_or(format!("{healthy:?}"))
    })
    .await;
}

fn host(url: &str) -> String {
    url.trim_start_matches("http://").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_load_and_config_and_a_replica_lost_or_late_costs_nothing() {
    let mut stack = start_stack(
        StackBuilder::new()
            .decode_workers(3)
            .prefill_workers(1)
            .control_planes(2)
            .serving_mode(ServingMode::Conditional)
            .route_timeout_ms(2_000),
    )
    .await;
    let http = client();
    let url = format!("{}/v1/chat/completions", stack.gateway_url());
    let replica_hosts = [
        host(&stack.control_plane_replica_url(0)),
        host(&stack.control_plane_replica_url(1)),
    ];
    wait_both_healthy(
        &http,
        &stack,
        "Envoy health-checks both replicas as ready",
        Duration::from_secs(10),
    )
    .await;

    // A burst of long streams, one after another as fast as each gets its headers: Envoy
    // alternates the route calls between the replicas.
    const BURST: usize = 7;
    let mut streams = Vec::new();
    let mut served: BTreeMap<String, u64> = BTreeMap::new();
    for i in 0..BURST {
        let body = json!({
            "model": "qwen3",
            "messages": [{"role": "user", "content": long_prompt(&format!("burst {i}"))}],
            "max_tokens": 4_000,
            "stream": true,
        });
        let response =
            tokio::time::timeout(Duration::from_secs(30), http.post(&url).json(&body).send())
                .await
                .expect("headers within 30 s")
                .expect("POST through the gateway");
        assert_eq!(response.status(), 200);
        let route = response.headers()[ROUTE_HEADER]
            .to_str()
            .unwrap()
            .to_string();
        assert!(
            matches!(route.as_str(), "bypass" | "disagg"),
            "a verdict, not {route}"
        );
        let destination = response.headers()[DESTINATION_RESPONSE_HEADER]
            .to_str()
            .unwrap()
            .to_string();
        *served.entry(destination).or_default() += 1;
        streams.push(response);
    }
    // As one replica spreads cold requests: by load, so no worker gets two more than another.
    let counts: Vec<u64> = served.values().copied().collect();
    assert_eq!(served.len(), 3, "every decode worker got some: {served:?}");
    assert!(
        counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1,
        "spread as one replica would: {served:?}"
    );
    // Both replicas see every request of the burst, on the worker that serves it.
    let by_address = switchyard_e2e::worker_addresses(&http, &stack)
        .await
        .unwrap();
    let expected: BTreeMap<String, u64> = by_address
        .iter()
        .filter(|(id, _)| id.starts_with("decode"))
        .map(|(id, address)| (id.clone(), served.get(address).copied().unwrap_or(0)))
        .collect();
    for replica in 0..2 {
        eventually_ok(
            &format!("replica {replica} sees the whole burst"),
            Duration::from_secs(5),
            || async {
                let seen = in_flight(&http, &stack, replica).await;
                (seen == expected)
                    .then_some(())
                    .ok_or(format!("{seen:?} != {expected:?}"))
            },
        )
        .await;
    }
    // The streams end (the clients go away): the lifecycle reports, whichever replica they
    // reach, free the load on both.
    drop(streams);
    for replica in 0..2 {
        eventually_ok(
            &format!("replica {replica} sees the burst done"),
            Duration::from_secs(10),
            || async {
                let seen = in_flight(&http, &stack, replica).await;
                seen.values()
                    .all(|n| *n == 0)
                    .then_some(())
                    .ok_or(format!("{seen:?}"))
            },
        )
        .await;
    }

    // Each replica's status says which replica it is (each shows its own verdicts).
    let mut names = Vec::new();
    for replica in 0..2 {
        let status: Value = http
            .get(format!(
                "{}/v1/status",
                stack.control_plane_replica_admin_url(replica)
            ))
            .bearer_auth(stack.control_plane_admin_token())
            .send()
            .await
            .expect("/v1/status answers")
            .json()
            .await
            .expect("JSON");
        names.push(status["replica"].as_str().unwrap_or_default().to_string());
    }
    assert!(
        names.iter().all(|n| !n.is_empty()) && names[0] != names[1],
        "{names:?}"
    );
    // And its page says so: its share is one replica's, not the fleet's.
    let scratch = TempDir::new("replica-page").expect("scratch");
    let page = format!(
        "{}/#token={}",
        stack.control_plane_replica_admin_url(1),
        stack.control_plane_admin_token()
    );
    let dom = Chromium::locate().dump_dom(&page, Duration::from_secs(3), scratch.path());
    assert!(
        dom.contains(&format!("Replica {}: the verdicts", names[1])),
        "the page does not say whose verdicts it shows:\n{dom}"
    );

    // One PUT, on either replica, changes both, under one version.
    let (_, before) = config(&http, &stack, 0).await;
    assert!(!before.is_empty(), "the shared config has a version");
    let (status, body, version) =
        put_config(&http, &stack, 1, json!({"eff_isl_threshold": 1234})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["eff_isl_threshold"], 1234);
    assert_ne!(version, before);
    eventually_ok(
        "replica 0 applies replica 1's change",
        Duration::from_secs(5),
        || async {
            let (config, etag) = config(&http, &stack, 0).await;
            (config["eff_isl_threshold"] == 1234 && etag == version)
                .then_some(())
                .ok_or(format!("{config} at {etag}"))
        },
    )
    .await;
    // The same value again writes no revision: the version holds, on both replicas.
    let (status, body, unchanged) =
        put_config(&http, &stack, 0, json!({"eff_isl_threshold": 1234})).await;
    assert_eq!(
        (status, unchanged.as_str()),
        (200, version.as_str()),
        "{body}"
    );
    for replica in 0..2 {
        assert_eq!(
            config(&http, &stack, replica).await.1,
            version,
            "replica {replica}"
        );
    }
    let (status, body, _) = put_config(&http, &stack, 0, json!({"eff_isl_threshold": -1})).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["code"], "invalid_config");
    // A change made on the version before replica 1's is refused on replica 0, naming the
    // current one: the two writers do not silently undo each other.
    let stale = json!({"eff_isl_threshold": 4321});
    let (status, body, current) = config_call(&http, &stack, 0, Some(stale), Some(&before)).await;
    assert_eq!(status, 412, "{body}");
    assert_eq!(body["code"], "config_version_mismatch");
    assert_eq!(current, version);
    for replica in 0..2 {
        assert_eq!(
            config(&http, &stack, replica).await.1,
            version,
            "nothing written"
        );
    }

    // NATS recreated without its JetStream data (kept in memory, or on an emptyDir): the
    // bucket's revisions start again. A PUT still reaches both replicas, under one version;
    // it answered 200 and was applied nowhere, its revision below theirs.
    stack.stop_component(Component::Nats);
    std::fs::remove_dir_all(stack.run_dir().join("nats-store")).expect("drop NATS's store");
    stack.restart_nats().await.expect("NATS starts again");
    let mut reset = None;
    let mut last = String::new();
    for _ in 0..60 {
        let (status, body, version) =
            put_config(&http, &stack, 1, json!({"eff_isl_threshold": 999})).await;
        if status == 200 {
            reset = Some(version);
            break;
        }
        last = format!("{status} {body}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let reset = reset.unwrap_or_else(|| panic!("no PUT after NATS lost its store: {last}"));
    eventually_ok(
        "both replicas follow the recreated store",
        Duration::from_secs(15),
        || async {
            let mut seen = Vec::new();
            for replica in 0..2 {
                let (config, etag) = config(&http, &stack, replica).await;
                seen.push((config["eff_isl_threshold"].clone(), etag));
            }
            seen.iter()
                .all(|(threshold, etag)| threshold == 999 && etag == &reset)
                .then_some(())
                .ok_or(format!("{seen:?}, the PUT said {reset}"))
        },
    )
    .await;
    wait_both_healthy(
        &http,
        &stack,
        "both replicas ready after the NATS restart",
        Duration::from_secs(15),
    )
    .await;

    // Drill: replica 1 killed under streaming load, then started again.
    let run = drill::start(&http, &stack.gateway_url(), DrillLoad::default());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let killed_at = run.elapsed();
    stack.stop_component(Component::ControlPlaneReplica(1));
    eventually_ok(
        "Envoy stops health-checking replica 1 as ready",
        Duration::from_secs(3),
        || async {
            let healthy = healthy_replicas(&http, &stack).await;
            (healthy == [replica_hosts[0].clone()])
                .then_some(())
                .ok_or(format!("{healthy:?}"))
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    stack
        .restart_control_plane_replica(1)
        .await
        .expect("replica 1 starts again");
    let restarted_at = run.elapsed();
    // Started again, it serves HTTP but is not ready: its index is empty.
    let readyz = get_text(
        &http,
        &format!("{}/readyz", stack.control_plane_replica_url(1)),
    )
    .await
    .unwrap();
    assert!(readyz.contains(r#""ready":false"#), "{readyz}");
    stack
        .wait_ready(1, Duration::from_secs(15))
        .await
        .expect("replica 1 gets ready");
    let ready_at = run.elapsed();
    wait_both_healthy(
        &http,
        &stack,
        "Envoy sends route calls to replica 1 again",
        Duration::from_secs(3),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let report = run.finish().await;
    report.assert_none_failed("replica killed", 30);
    let baseline = report
        .affinity_share(Duration::ZERO, killed_at)
        .expect("turns before the kill");
    // The drills' sanity bar (e2e_drills): random routing over 3 workers keeps ~33 %. Two
    // replicas each move a few turns per hundred on purpose, so ~40 turns land near 80 %.
    assert!(baseline >= 0.7, "affinity before the kill: {baseline}");
    let during = report
        .affinity_share(killed_at, restarted_at)
        .expect("turns while replica 1 was down");
    // Route calls already on their way to the killed replica fail open until Envoy's health
    // check (every 0.5 s) takes it out; the rest keep their affinity.
    assert!(
        during >= 0.6,
        "the other replica kept routing with affinity: {during}"
    );
    let recovery = report.recovered_after(restarted_at, 0.9 * baseline);
    drill::report(&report.row(
        "one of 2 control-plane replicas killed, restarted",
        &format!(
            "affinity {:.0} % before, {:.0} % while down; restarted replica ready {:.1} s after start; quality at goal {}",
            baseline * 100.0,
            during * 100.0,
            (ready_at - restarted_at).as_secs_f64(),
            recovery.map_or("never".to_string(), |d| format!("{} s after restart", d.as_secs()))
        ),
    ));
    assert!(
        recovery.is_some_and(|d| d <= Duration::from_secs(5)),
        "{recovery:?}"
    );

    // The late replica's index came from the workers' dumps: the same as the other's.
    eventually_ok(
        "both replicas hold the same index",
        Duration::from_secs(5),
        || async {
            let (a, b) = (
                cached_blocks(&http, &stack, 0).await,
                cached_blocks(&http, &stack, 1).await,
            );
            (a == b && a.values().any(|n| *n > 0))
                .then_some(())
                .ok_or(format!("{a:?} != {b:?}"))
        },
    )
    .await;
    let metrics = get_text(
        &http,
        &format!("{}/metrics", stack.control_plane_replica_url(0)),
    )
    .await
    .unwrap();
    // How stale one replica's view of the other's decisions gets: NATS delivery plus the
    // router task's queue, measured on every update applied.
    let lag = "switchyard_replica_sync_lag_seconds";
    let applied = switchyard_e2e::prom_sum(&metrics, &format!("{lag}_count"));
    assert!(
        applied > 20.0,
        "replica 0 applied replica 1's updates: {applied}"
    );
    let (p50, p99) = (
        drill::histogram_quantile(&metrics, lag, 0.5).unwrap(),
        drill::histogram_quantile(&metrics, lag, 0.99).unwrap(),
    );
    eprintln!(
        "REPLICA SYNC LAG: {applied} updates applied by replica 0; p50 ≤ {:.1} ms, p99 ≤ {:.1} ms",
        p50 * 1e3,
        p99 * 1e3
    );
    assert!(
        p99 <= 0.1,
        "a replica's view is at most 100 ms stale at p99: {p99}"
    );
    stack.check_running().expect("every process still runs");
}
