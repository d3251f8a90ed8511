//! One case measured through both listeners, the tokenizer's load, and another stream beside
//! a cold 128k prompt.

use std::time::Duration;

use anyhow::{bail, Context as _};
use switchyard_stack::{Component, Stack};
use tokio::time::Instant;

use crate::probes::{filter_stats, route_latency_totals, stat, timed, worker_cpu_seconds};
use crate::prompts::chat_of;
use crate::stub::StubControlPlane;

/// The mode column of the floor's rows.
const FLOOR_MODE: &str = "floor (stand-in control plane)";

/// Small-request repetitions of the interference measurement.
const INTERFERENCE_REPETITIONS: usize = 10;

/// One case's measurements.
pub(crate) struct Row {
    pub(crate) mode: &'static str,
    pub(crate) case: String,
    pub(crate) isl: usize,
    pub(crate) plain: Vec<f64>,
    pub(crate) filtered: Vec<f64>,
    pub(crate) not_routed: usize,
    pub(crate) cpu_plain_ms: f64,
    pub(crate) cpu_filtered_ms: f64,
    /// Mean time the control plane spent per route call (its own histogram).
    pub(crate) control_plane_ms: f64,
    pub(crate) route_call_bytes: f64,
    /// Route calls that carried the body in `filter` mode.
    pub(crate) body_fallbacks: u64,
}

/// The URLs of the gateway and plain listeners.
pub(crate) fn urls(stack: &Stack) -> anyhow::Result<(String, String)> {
    let plain = stack
        .plain_gateway_url()
        .context("the stack has a plain listener")?;
    Ok((
        format!("{}/v1/chat/completions", stack.gateway_url()),
        format!("{plain}/v1/chat/completions"),
    ))
}

/// Measures one case: `body(i)` is the i-th request's body.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn measure(
    stack: &Stack,
    http: &reqwest::Client,
    mode: &'static str,
    case: String,
    isl: usize,
    body: impl Fn(usize) -> Vec<u8>,
    requests: usize,
    deadline: Instant,
) -> anyhow::Result<Row> {
    let (filtered_url, plain_url) = urls(stack)?;
    let mut row = Row {
        mode,
        case,
        isl,
        plain: Vec::new(),
        filtered: Vec::new(),
        not_routed: 0,
        cpu_plain_ms: 0.0,
        cpu_filtered_ms: 0.0,
        control_plane_ms: 0.0,
        route_call_bytes: 0.0,
        body_fallbacks: 0,
    };
    // Bodies are numbered across the phases: a cold case never repeats one.
    let mut next = 0usize;
    let mut take = || {
        next += 1;
        body(next)
    };
    // Warm-up: connections, and for warm cases the conversation in every cache.
    for _ in 0..2 {
        timed(http, &filtered_url, &take()).await?;
        timed(http, &plain_url, &take()).await?;
    }
    let (sum_before, count_before) = route_latency_totals(stack, http).await;
    let stats_before = filter_stats(stack, http).await;
    for _ in 0..requests {
        if Instant::now() > deadline {
            eprintln!("{mode} {}: time budget reached", row.case);
            break;
        }
        let (plain, _) = timed(http, &plain_url, &take()).await?;
        let (filtered, routed) = timed(http, &filtered_url, &take()).await?;
        row.plain.push(plain.as_secs_f64() * 1e3);
        row.filtered.push(filtered.as_secs_f64() * 1e3);
        row.not_routed += usize::from(!routed);
    }
    let (sum_after, count_after) = route_latency_totals(stack, http).await;
    let stats_after = filter_stats(stack, http).await;
    let delta = |name| stat(&stats_after, name).saturating_sub(stat(&stats_before, name));
    let calls = delta("route_calls_total").max(1);
    row.route_call_bytes = delta("route_call_bytes_total") as f64 / calls as f64;
    if mode == "filter" {
        row.body_fallbacks = calls.saturating_sub(delta("route_input.hashes_total"));
    }
    row.control_plane_ms = (sum_after - sum_before) * 1e3 / (count_after - count_before).max(1.0);
    let pid = stack.pid(Component::Envoy).context("envoy runs")?;
    for (url, slot) in [(&plain_url, 0), (&filtered_url, 1)] {
        let before = worker_cpu_seconds(pid);
        let mut sent = 0;
        while sent < requests && Instant::now() < deadline {
            timed(http, url, &take()).await?;
            sent += 1;
        }
        let per_request_ms = (worker_cpu_seconds(pid) - before) * 1e3 / sent.max(1) as f64;
        if slot == 0 {
            row.cpu_plain_ms = per_request_ms;
        } else {
            row.cpu_filtered_ms = per_request_ms;
        }
    }
    row.plain.sort_by(f64::total_cmp);
    row.filtered.sort_by(f64::total_cmp);
    Ok(row)
}

/// The floor ([`StubControlPlane`]): takes one verdict from the real control plane for a
/// warm chat, stops it, starts the stand-in on its port with that verdict, and measures each
/// size's warm case again through both listeners. The control plane stays stopped.
pub(crate) async fn floor_rows(
    stack: &mut Stack,
    http: &reqwest::Client,
    sizes: &[(&'static str, usize, usize)],
    requests: usize,
    deadline: Instant,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let probe = chat_of(sizes.first().map_or(8_192, |s| s.1), "floor", 0);
    let verdict = http
        .post(format!("{}/v1/route", stack.control_plane_url()))
        .header(switchyard_protocol::route::API_HEADER, "chat")
        .json(&probe)
        .send()
        .await?
        .error_for_status()
        .context("the control plane routes the floor's probe")?
        .bytes()
        .await?
        .to_vec();
    let port: u16 = stack
        .control_plane_url()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .context("the control plane's port")?;
    stack.stop_component(Component::ControlPlane);
    let stand_in = StubControlPlane::start(port, verdict).await?;
    // Envoy's health check must see the stand-in before route calls reach it again.
    let (filtered_url, _) = urls(stack)?;
    let started = Instant::now();
    loop {
        let (_, routed) = timed(http, &filtered_url, &probe.to_string().into_bytes()).await?;
        if routed {
            break;
        }
        if started.elapsed() > Duration::from_secs(30) {
            bail!("the gateway did not route through the stand-in within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for &(size, bytes, isl) in sizes {
        eprintln!("{FLOOR_MODE}: {size} warm...");
        let salt = format!("floor{size}");
        let warm = |i: usize| chat_of(bytes, &salt, i).to_string().into_bytes();
        let row = measure(
            stack,
            http,
            FLOOR_MODE,
            format!("{size} warm"),
            isl,
            warm,
            requests,
            deadline,
        );
        rows.push(row.await?);
    }
    stand_in.stop().await;
    Ok(())
}

/// What a mode's stack showed besides the cases.
pub(crate) struct ModeSummary {
    pub(crate) mode: &'static str,
    pub(crate) rss_start_mib: f64,
    pub(crate) rss_end_mib: f64,
    /// `filter` mode: seconds from the first request until the VM had the tokenizer, and the
    /// worker thread's CPU seconds over that time.
    pub(crate) tokenizer_load: Option<(f64, f64)>,
    pub(crate) small_alone_ms: Vec<f64>,
    pub(crate) small_contended_ms: Vec<f64>,
}

/// In `filter` mode, sends one request and waits (bounded) until the VM loaded the tokenizer.
pub(crate) async fn load_tokenizer(
    stack: &Stack,
    http: &reqwest::Client,
    body: &[u8],
) -> anyhow::Result<(f64, f64)> {
    let (filtered_url, _) = urls(stack)?;
    let pid = stack.pid(Component::Envoy).context("envoy runs")?;
    let cpu_before = worker_cpu_seconds(pid);
    let started = Instant::now();
    timed(http, &filtered_url, body).await?;
    loop {
        let stats = filter_stats(stack, http).await;
        if stat(&stats, "tokenizer.loads_total") >= 1 {
            break;
        }
        if stat(&stats, "tokenizer.load_failures_total") > 0 {
            bail!("the VM could not load the tokenizer (see envoy.log)");
        }
        if started.elapsed() > Duration::from_secs(300) {
            bail!("the VM did not load the tokenizer within 300 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok((
        started.elapsed().as_secs_f64(),
        worker_cpu_seconds(pid) - cpu_before,
    ))
}

/// A small request's latency alone, and sent 20 ms after a cold 128k request (same worker
/// thread: `--concurrency 1`), [`INTERFERENCE_REPETITIONS`] times each.
pub(crate) async fn interference(
    stack: &Stack,
    http: &reqwest::Client,
    mode: &'static str,
    big_bytes: usize,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let (filtered_url, _) = urls(stack)?;
    let small = |i: usize| chat_of(2_000, "small", i).to_string().into_bytes();
    timed(http, &filtered_url, &small(0)).await?;
    let (mut alone, mut contended) = (Vec::new(), Vec::new());
    for r in 0..INTERFERENCE_REPETITIONS {
        let (t, _) = timed(http, &filtered_url, &small(2 * r + 1)).await?;
        alone.push(t.as_secs_f64() * 1e3);
        let big = chat_of(big_bytes, &format!("interfere{mode}{r}"), 0)
            .to_string()
            .into_bytes();
        let big_client = http.clone();
        let big_url = filtered_url.clone();
        let big_request = tokio::spawn(async move { timed(&big_client, &big_url, &big).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let (t, _) = timed(http, &filtered_url, &small(2 * r + 2)).await?;
        contended.push(t.as_secs_f64() * 1e3);
        big_request.await??;
    }
    alone.sort_by(f64::total_cmp);
    contended.sort_by(f64::total_cmp);
    Ok((alone, contended))
}
