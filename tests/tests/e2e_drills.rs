//! Fault drills on one control plane, each under a bounded streaming load of multi-turn
//! conversations through real Envoy (see `switchyard_e2e::drill`), one after another on one
//! stack (the destructive ones last). Each records requests sent / succeeded / failed, the
//! fail-opens, and how long routing quality (the share of turns routed with KV affinity) or
//! the index took to recover; each fails if its goal is missed. The printed `DRILL` rows are
//! the table in `docs/reliability.md` (the replica-loss drill is in `e2e_replicas`).
//!
//! 1. The control plane frozen (SIGSTOP) past the route timeout: 0 failed, every fail-open
//!    counted by the filter.
//! 2. The control plane killed and started again: 0 failed (fail open), quality back ≤ 5 s
//!    after the restart.
//! 3. NATS killed and started again: 0 failed, the index equal to the workers' caches ≤ 5 s
//!    after NATS returns. Then NATS frozen (SIGSTOP), its connections up but silent: 0 failed,
//!    `/healthz` says `not_answering` within 3 s.
//! 4. Two decode workers' KV events dropped for 2 s (a gap) under traffic: detected, resynced,
//!    counted; the index equal to their caches ≤ 5 s after the load ends.
//! 5. The prefill worker killed: 0 failed (local prefill).
//! 6. A decode worker killed: only the requests it was serving fail (a 5xx, or a cut stream);
//!    Envoy retries those routed to it before it expires on another worker; none goes to it
//!    ≥ 3 s after.
//!
//! Needs `cargo build -p switchyard-filter --target wasm32-wasip1 --profile wasm && cargo
//! build --workspace --bins` first (the tests build nothing).

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use switchyard_e2e::drill::{self, DrillLoad, DrillReport, DrillRun};
use switchyard_e2e::probe::{filter_stat, worker_metric};
use switchyard_e2e::{
    admin_get_json, client, envoy_stats, eventually_ok, get_text, prom_sum, start_stack, Signal,
};
use switchyard_e2e::{chat_body, post_observed};
use switchyard_stack::{Component, ServingMode, Stack, StackBuilder};

/// Load before a fault, to measure the routing quality it starts from.
const BASELINE: Duration = Duration::from_secs(3);

/// Per worker: KV blocks the control plane's index holds, and what the worker itself caches.
async fn index_and_truth(
    http: &reqwest::Client,
    stack: &Stack,
) -> (BTreeMap<String, u64>, BTreeMap<String, u64>) {
    let json = admin_get_json(http, stack, "/v1/workers")
        .await
        .unwrap_or_default();
    let index = json["workers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|w| {
            (
                w["info"]["worker_id"].as_str().unwrap_or("?").to_string(),
                w["cached_blocks"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    let mut truth = BTreeMap::new();
    for worker in stack.workers() {
        let blocks = worker_metric(http, &worker.address, "switchyard_kv_cached_blocks").await;
        truth.insert(worker.id.0.clone(), blocks as u64);
    }
    (index, truth)
}

/// Waits (at most `limit`) until the index holds exactly what `workers` cache; how long it took.
async fn index_resynced(
    http: &reqwest::Client,
    stack: &Stack,
    workers: &[&str],
    limit: Duration,
) -> Duration {
    let started = Instant::now();
    eventually_ok("the index equals the workers' caches", limit, || async {
        let (index, truth) = index_and_truth(http, stack).await;
        let differ: Vec<_> = workers
            .iter()
            .filter(|w| index.get(**w) != truth.get(**w))
            .collect();
        differ
            .is_empty()
            .then_some(())
            .ok_or(format!("index {index:?}, workers {truth:?}"))
    })
    .await;
    started.elapsed()
}

async fn fail_opens(http: &reqwest::Client, stack: &Stack) -> u64 {
    let stats = envoy_stats(http, &stack.admin_url())
        .await
        .expect("Envoy stats");
    filter_stat(&stats, "fail_open_total")
}

async fn baseline(http: &reqwest::Client, stack: &Stack) -> DrillRun {
    let run = drill::start(http, &stack.gateway_url(), DrillLoad::default());
    tokio::time::sleep(BASELINE).await;
    run
}

fn baseline_share(report: &DrillReport) -> f64 {
    let share = report
        .affinity_share(Duration::ZERO, BASELINE)
        .expect("turns before the fault");
    assert!(share >= 0.7, "affinity before the fault: {share}");
    share
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_drills_on_one_control_plane() {
    let mut stack = start_stack(
        StackBuilder::new()
            .decode_workers(3)
            .prefill_workers(1)
            .isolate_one_decode_worker(true)
            .serving_mode(ServingMode::Conditional)
            .route_timeout_ms(1_000),
    )
    .await;
    let http = client();
    let mut rows = Vec::new();

    // 1. Frozen past the route timeout.
    let opened_before = fail_opens(&http, &stack).await;
    let run = baseline(&http, &stack).await;
    stack.freeze(Component::ControlPlane).expect("SIGSTOP");
    tokio::time::sleep(Duration::from_secs(3)).await;
    stack
        .signal(Component::ControlPlane, Signal::Cont)
        .expect("SIGCONT");
    let thawed_at = run.elapsed();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let report = run.finish().await;
    let counted = fail_opens(&http, &stack).await - opened_before;
    let quality = baseline_share(&report);
    let recovery = report.recovered_after(thawed_at, 0.9 * quality);
    rows.push(report.row(
        "control plane frozen (SIGSTOP) 3 s, route timeout 1 s",
        &format!(
            "{counted} fail-opens counted by the filter; quality back {}",
            after(recovery)
        ),
    ));
    report.assert_none_failed("frozen control plane", 20);
    assert!(
        report.failed_open() > 0,
        "the freeze outlasted the route timeout"
    );
    assert_eq!(
        counted,
        report.failed_open() as u64,
        "every fail-open counted"
    );
    assert_back_within_5_s(&report, recovery);

    // Nothing the freeze left stays counted in flight: a route call that waited in the
    // stopped control plane's socket is answered after the thaw although its request failed
    // open, and the filter's `failed_open` report keeps it from being counted (the router
    // would steer turns away from that worker until the request timeout, minutes later).
    // Each fail-open followed a route call, so each is reported `failed_open` (a batch whose
    // POST timed out while the control plane was stopped may be read late and then sent again:
    // counted twice, applied once).
    eventually_ok(
        "every fail-open reported",
        Duration::from_secs(5),
        || async {
            let metrics = control_plane_metrics(&http, &stack).await?;
            let reported = prom_sum(
                &metrics,
                r#"switchyard_lifecycle_events_total{event="failed_open"}"#,
            );
            (reported >= counted as f64)
                .then_some(())
                .ok_or(format!("{reported} of {counted} reported"))
        },
    )
    .await;
    let left = settled_in_flight(&http, &stack).await;
    let late = prom_sum(
        &control_plane_metrics(&http, &stack).await.unwrap(),
        "switchyard_late_route_calls_total",
    );
    println!("after the freeze: {left} in flight, {late} late route calls not counted");
    assert_eq!(left, 0.0, "requests of the freeze still counted in flight");

    // 1b. Requests routed before the control plane stops and finished while it is stopped:
    // their `done` reports cannot be taken then, and are sent again once it runs, so none
    // stays counted in flight.
    let requeued_before = filter_stat(
        &envoy_stats(&http, &stack.admin_url()).await.unwrap(),
        "lifecycle.reports_requeued_total",
    );
    let url = format!("{}/v1/chat/completions", stack.gateway_url());
    let streams: Vec<_> = (0..3)
        .map(|i| {
            let (http, url) = (http.clone(), url.clone());
            let body = chat_body(
                &format!("Tell me about lighthouse optics, part {i}."),
                256,
                true,
            );
            tokio::spawn(async move {
                post_observed(&http, &url, &body, &[], Duration::from_secs(60)).await
            })
        })
        .collect();
    // Stopped only once all three are routed (counted in flight), so no route call waits.
    in_flight_becomes(&http, &stack, "the three requests routed", |n| n >= 3.0).await;
    stack.freeze(Component::ControlPlane).expect("SIGSTOP");
    for stream in streams {
        let answer = stream
            .await
            .expect("joins")
            .expect("answered while the control plane is stopped");
        assert_eq!(answer.status, 200, "{}", answer.body());
    }
    // Past the lifecycle POST's timeout (1 s): the reports were sent and not taken.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    stack
        .signal(Component::ControlPlane, Signal::Cont)
        .expect("SIGCONT");
    in_flight_becomes(&http, &stack, "every finished request reported done", |n| {
        n == 0.0
    })
    .await;
    let requeued = filter_stat(
        &envoy_stats(&http, &stack.admin_url()).await.unwrap(),
        "lifecycle.reports_requeued_total",
    );
    assert!(requeued > requeued_before, "the reports were sent again");

    // 1c. A client that leaves while its route call waits (the control plane stopped for
    // less than the call's timeout): the call is still read and routed once the control plane
    // runs, and the filter's `failed_open` report, sent when the client left, keeps it from
    // being counted in flight (it was, until the request timeout).
    in_flight_becomes(&http, &stack, "nothing in flight before", |n| n == 0.0).await;
    stack.freeze(Component::ControlPlane).expect("SIGSTOP");
    let impatient = http
        .post(&url)
        .json(&chat_body(
            "A client that will not wait for its answer.",
            16,
            true,
        ))
        .timeout(Duration::from_millis(300))
        .send()
        .await;
    assert!(impatient.is_err(), "the client gave up: {impatient:?}");
    // Thawed within the route call's 1 s timeout, so the call is still there to be read.
    stack
        .signal(Component::ControlPlane, Signal::Cont)
        .expect("SIGCONT");
    // Long enough for the late route call and the report to be read.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    in_flight_becomes(&http, &stack, "the abandoned request not counted", |n| {
        n == 0.0
    })
    .await;

    // 2. Killed and started again (one replica: the filter fails open meanwhile).
    let run = baseline(&http, &stack).await;
    stack.stop_component(Component::ControlPlane);
    tokio::time::sleep(Duration::from_secs(3)).await;
    stack.restart_control_plane().await.expect("restarts");
    let restarted_at = run.elapsed();
    tokio::time::sleep(Duration::from_secs(7)).await;
    let report = run.finish().await;
    let quality = baseline_share(&report);
    let recovery = report.recovered_after(restarted_at, 0.9 * quality);
    rows.push(report.row(
        "control plane killed 3 s, restarted (1 replica)",
        &format!("quality back {} after the restart", after(recovery)),
    ));
    report.assert_none_failed("killed control plane", 20);
    assert_back_within_5_s(&report, recovery);

    // 3. NATS killed and started again.
    let run = baseline(&http, &stack).await;
    stack.stop_component(Component::Nats);
    tokio::time::sleep(Duration::from_secs(3)).await;
    stack
        .restart_nats()
        .await
        .expect("NATS restarts on its port");
    let report = run.finish().await;
    let all: Vec<&str> = stack.workers().iter().map(|w| w.id.0.as_str()).collect();
    let resynced = index_resynced(&http, &stack, &all, Duration::from_secs(5)).await;
    rows.push(report.row(
        "NATS killed 3 s, restarted",
        &format!(
            "index equal to the workers' caches {:.1} s after NATS returned",
            resynced.as_secs_f64()
        ),
    ));
    report.assert_none_failed("NATS outage", 20);

    // 3b. NATS frozen (SIGSTOP): its connections stay up, so the client alone would call it
    // connected for minutes while no heartbeat arrives. Every worker expired after 3 s and
    // Envoy answered 503 to every request until NATS ran again.
    let health = format!("{}/healthz", stack.control_plane_url());
    let run = baseline(&http, &stack).await;
    stack.freeze(Component::Nats).expect("SIGSTOP nats-server");
    eventually_ok(
        "the control plane hears NATS is not answering",
        Duration::from_secs(3),
        || async {
            let text = get_text(&http, &health).await?;
            text.contains("not_answering").then_some(()).ok_or(text)
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    stack
        .signal(Component::Nats, Signal::Cont)
        .expect("SIGCONT nats-server");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let report = run.finish().await;
    rows.push(report.row(
        "NATS frozen (SIGSTOP) 6 s",
        "workers kept while it was silent",
    ));
    report.assert_none_failed("frozen NATS", 20);

    // 4. KV events lost for 2 s (decode-0 and decode-1's process): a gap.
    let cp_metrics = format!("{}/metrics", stack.control_plane_url());
    let gap_resyncs = |text: &str| {
        text.lines()
            .filter(|l| {
                l.starts_with("switchyard_resync_requests_total") && l.contains(r#"reason="gap""#)
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let before = gap_resyncs(&get_text(&http, &cp_metrics).await.unwrap());
    let run = baseline(&http, &stack).await;
    stack
        .signal(Component::Workers, Signal::Usr1)
        .expect("SIGUSR1");
    // The gap shows at the first batch after the outage: the traffic goes on meanwhile.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let report = run.finish().await;
    let lossy = ["decode-0", "decode-1"];
    let resynced = index_resynced(&http, &stack, &lossy, Duration::from_secs(5)).await;
    let detected = gap_resyncs(&get_text(&http, &cp_metrics).await.unwrap()) - before;
    let dropped = {
        let mut sum = 0.0;
        for worker in stack
            .workers()
            .iter()
            .filter(|w| lossy.contains(&w.id.0.as_str()))
        {
            sum += worker_metric(
                &http,
                &worker.address,
                "switchyard_kv_event_batches_dropped_total",
            )
            .await;
        }
        sum
    };
    rows.push(report.row(
        "2 decode workers' KV events dropped for 2 s",
        &format!(
            "{dropped} batches dropped; {detected} gap resyncs asked; index equal to their caches {:.1} s after",
            resynced.as_secs_f64()
        ),
    ));
    report.assert_none_failed("KV event gap", 20);
    assert!(dropped > 0.0, "the fault dropped batches");
    assert!(
        detected >= 1.0,
        "the gap was detected and a resync asked for"
    );

    // 5. The prefill worker killed: local prefill, then aggregated serving.
    let run = baseline(&http, &stack).await;
    stack
        .signal(Component::PrefillWorkers, Signal::Kill)
        .expect("SIGKILL");
    stack.reap_exited();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let report = run.finish().await;
    rows.push(report.row(
        "prefill worker killed",
        "local prefill on the decode workers",
    ));
    report.assert_none_failed("prefill worker killed", 20);

    // 6. A decode worker killed: the requests it was serving fail; no new one goes to it.
    let victim = stack
        .workers()
        .iter()
        .rfind(|w| w.id.0.starts_with("decode"))
        .expect("a decode worker")
        .id
        .0
        .clone();
    let rerouted_before = filter_stat(
        &envoy_stats(&http, &stack.admin_url()).await.unwrap(),
        "rerouted_total",
    );
    let run = baseline(&http, &stack).await;
    let killed_at = run.elapsed();
    stack
        .signal(Component::IsolatedDecodeWorker, Signal::Kill)
        .expect("SIGKILL");
    stack.reap_exited();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let report = run.finish().await;
    let failed = report.failed();
    let last_to_victim = report
        .outcomes
        .iter()
        .filter(|o| o.worker.as_deref() == Some(victim.as_str()))
        .map(|o| o.at)
        .max();
    rows.push(report.row(
        "decode worker killed",
        &format!(
            "{} failed, each on the killed worker; last request sent to it {}",
            failed.len(),
            last_to_victim.map_or("before the kill".into(), |at| format!(
                "{:.1} s after the kill",
                at.saturating_sub(killed_at).as_secs_f64()
            ))
        ),
    ));
    for row in &rows {
        drill::report(row);
    }
    // Only what was in flight on it when it died: at most one request per client, each sent
    // before the kill, each ending in a 5xx or a cut stream. Requests routed to it afterwards
    // (before its heartbeats expire) are retried on another worker by Envoy.
    assert!(
        failed.len() <= DrillLoad::default().clients,
        "only what was in flight on it: {failed:?}"
    );
    for outcome in &failed {
        assert!(
            outcome.worker.as_deref().is_none_or(|w| w == victim),
            "only requests on the killed worker fail: {outcome:?}"
        );
        assert!(
            outcome.at <= killed_at + Duration::from_millis(500),
            "in flight at the kill: {outcome:?}"
        );
        assert!(outcome.status == 0 || outcome.status >= 500, "{outcome:?}");
    }
    assert!(
        last_to_victim.is_none_or(|at| at < killed_at + Duration::from_secs(3)),
        "no new route to the killed worker after 3 s: {last_to_victim:?}"
    );
    // Requests routed to it before it expired were served elsewhere by Envoy's retry: each
    // response says where, and the filter counts each one.
    let rerouted: Vec<&drill::Outcome> = report
        .outcomes
        .iter()
        .filter(|o| o.rerouted_to.is_some())
        .collect();
    for outcome in &rerouted {
        assert!(
            outcome.ok && outcome.worker.as_deref() != Some(victim.as_str()),
            "{outcome:?}"
        );
    }
    let rerouted_after = filter_stat(
        &envoy_stats(&http, &stack.admin_url()).await.unwrap(),
        "rerouted_total",
    );
    assert_eq!(
        rerouted_after - rerouted_before,
        rerouted.len() as u64,
        "every response served away from its destination is counted"
    );
    eprintln!(
        "DECODE KILLED: {} requests rerouted by Envoy",
        rerouted.len()
    );
    let metrics = get_text(&http, &cp_metrics).await.unwrap();
    assert!(
        prom_sum(&metrics, "switchyard_workers_expired_total") >= 1.0,
        "{metrics}"
    );
}

async fn control_plane_metrics(http: &reqwest::Client, stack: &Stack) -> Result<String, String> {
    get_text(http, &format!("{}/metrics", stack.control_plane_url())).await
}

/// Requests the control plane counts in flight, summed over the workers.
async fn in_flight(http: &reqwest::Client, stack: &Stack) -> Result<f64, String> {
    let text = control_plane_metrics(http, stack).await?;
    Ok(prom_sum(&text, "switchyard_worker_in_flight"))
}

/// The in-flight count once it has stopped changing for a second (reports of a finished load
/// still on their way), bounded at 15 s.
async fn settled_in_flight(http: &reqwest::Client, stack: &Stack) -> f64 {
    let mut last = in_flight(http, stack).await.expect("control-plane metrics");
    for _ in 0..15 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = in_flight(http, stack).await.expect("control-plane metrics");
        if now == last {
            return now;
        }
        last = now;
    }
    panic!("the in-flight count never settled: {last}");
}

/// Waits (10 s at most) until the in-flight count satisfies `done`.
async fn in_flight_becomes(
    http: &reqwest::Client,
    stack: &Stack,
    what: &str,
    done: impl Fn(f64) -> bool,
) {
    eventually_ok(what, Duration::from_secs(10), || async {
        let n = in_flight(http, stack).await?;
        if done(n) {
            Ok(())
        } else {
            Err(format!("{n} in flight"))
        }
    })
    .await;
}

fn assert_back_within_5_s(report: &DrillReport, recovery: Option<Duration>) {
    assert!(
        recovery.is_some_and(|d| d <= Duration::from_secs(5)),
        "routing quality not back within 5 s: {recovery:?}\n{}",
        report.timeline()
    );
}

fn after(recovery: Option<Duration>) -> String {
    recovery.map_or("never".into(), |d| format!("≤ {} s", d.as_secs()))
}
