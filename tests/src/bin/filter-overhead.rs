//! `filter-overhead`: what the Switchyard filter adds to a request, in each `tokenize` mode,
//! measured on a real stack.
//!
//! Per mode (`control_plane`: the filter sends the body and the control plane tokenizes;
//! `filter`: the filter tokenizes in its VM and sends block hashes), one stack: one Envoy
//! (`--concurrency 1`, so one worker thread and one VM) with two listeners to the same single
//! simulated decode worker, the gateway listener with the filter and a plain one without it.
//! For chat prompts of about 8k, 32k and 128k tokens, each **warm** (a 16-message
//! conversation seen before, plus a new question) and **cold** (text never seen), requests
//! alternate between the two listeners (machine noise hits both alike): the client-measured
//! difference is what the gateway adds. Then each listener gets a block of requests alone
//! while the CPU time of Envoy's worker thread (`/proc/<pid>/task/*/stat`, threads named
//! `wrk:*`) is read before and after. Route-call bytes come from the filter's
//! `route_call_bytes_total` stat, the control plane's time from its route histogram, Envoy's
//! RSS from `/proc/<pid>/status` before the first request and after the last. Last, what a
//! cold 128k prompt does to another stream on the same worker thread: a small request's
//! latency alone, and sent while a cold 128k request is being routed.
//!
//! The worker is simulated (a GB200 model run 1000x faster than real time, one output token),
//! so its own time is small and the same for both paths. Bounded: `--requests` per case and
//! listener, `--max-seconds` overall.
//!
//! ```sh
//! cargo build -p switchyard-filter --target wasm32-wasip1 --profile wasm
//! cargo build --release --bin switchyard-control-plane --bin switchyard-sim-worker --bin filter-overhead
//! target/release/filter-overhead --release --requests 20
//! ```

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context as _};
use serde_json::{json, Value};
use switchyard_e2e::{client, envoy_stats, prom_sum, start_stack};
use switchyard_protocol::route::ApiKind;
use switchyard_protocol::tokenize::{default_model_dir, ModelTokenizer};
use switchyard_stack::{Component, Profile, SpeedUp, Stack, StackBuilder};
use tokio::time::Instant;

/// The `tokenize` modes, in the order they run.
const MODES: [&str; 2] = ["filter", "control_plane"];
/// Prompt sizes in tokens.
const SIZES: [(&str, usize); 3] = [("8k", 8_192), ("32k", 32_768), ("128k", 131_072)];
/// Messages of a conversation before its new question.
const MESSAGES: usize = 16;
/// Small-request repetitions of the interference measurement.
const INTERFERENCE_REPETITIONS: usize = 10;

/// Command-line settings (hand-parsed: a few flags do not need clap here).
struct Args {
    requests: usize,
    max_seconds: u64,
    release: bool,
    modes: Vec<&'static str>,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        requests: 20,
        max_seconds: 1_800,
        release: false,
        modes: MODES.to_vec(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--requests" => args.requests = it.next().context("--requests N")?.parse()?,
            "--max-seconds" => args.max_seconds = it.next().context("--max-seconds S")?.parse()?,
            "--release" => args.release = true,
            "--tokenize" => {
                let mode = it.next().context("--tokenize control_plane|filter|both")?;
                args.modes = match mode.as_str() {
                    "both" => MODES.to_vec(),
                    other => vec![*MODES
                        .iter()
                        .find(|m| **m == other)
                        .with_context(|| format!("--tokenize {other}: not a mode"))?],
                };
            }
            "-h" | "--help" => {
                println!(
                    "filter-overhead [--requests N (20)] [--max-seconds S (1800)] [--release] [--tokenize control_plane|filter|both (both)]"
                );
                std::process::exit(0);
            }
            other => bail!("unknown flag {other}"),
        }
    }
    if args.requests < 10 {
        bail!("--requests must be at least 10 (percentiles of fewer mean nothing)");
    }
    Ok(args)
}

/// English-like prose of about `bytes` bytes, numbered every 16 words with `salt` in each
/// number, so that texts of different salts share no stretch (and no tokenizer chunk).
fn prose(bytes: usize, salt: &str) -> String {
    const WORDS: [&str; 16] = [
        "the", "agent", "reads", "each", "file", "before", "it", "changes", "any", "line", "and",
        "then", "runs", "the", "tests", "again",
    ];
    let mut content = String::with_capacity(bytes + 64);
    let mut i = 0u64;
    while content.len() < bytes {
        if i.is_multiple_of(16) {
            content.push_str(&format!("step {salt}x{} ", i / 16));
        }
        content.push_str(WORDS[(i % 16) as usize]);
        content.push(' ');
        i += 1;
    }
    content
}

/// A chat of [`MESSAGES`] messages of `bytes` bytes in all (made from `salt`), then the
/// user's question number `question`.
fn chat_of(bytes: usize, salt: &str, question: usize) -> Value {
    let mut messages: Vec<Value> = (0..MESSAGES)
        .map(|m| {
            let role = if m % 2 == 0 { "user" } else { "assistant" };
            json!({"role": role, "content": prose(bytes / MESSAGES, &format!("{salt}m{m}"))})
        })
        .collect();
    messages.push(json!({
        "role": "user",
        "content": format!("Question {question}: which step changed the most, and why?"),
    }));
    json!({"model": "qwen3", "messages": messages, "max_tokens": 1, "stream": false})
}

/// Body bytes that make a chat of about `tokens` tokens, and its exact token count, found by
/// tokenizing one estimate with the control plane's tokenizer and scaling once.
fn calibrate(tokenizer: &ModelTokenizer, tokens: usize) -> anyhow::Result<(usize, usize)> {
    let isl = |bytes: usize| -> anyhow::Result<usize> {
        Ok(tokenizer
            .tokenize_request(ApiKind::Chat, &chat_of(bytes, "calibrate", 0))?
            .len())
    };
    let guess = tokens * 4;
    let bytes = guess * tokens / isl(guess)?.max(1);
    Ok((bytes, isl(bytes)?))
}

/// CPU time (user + system) of the process's threads whose name starts with `wrk:` (Envoy's
/// worker threads), in seconds.
fn worker_cpu_seconds(pid: u32, ticks_per_second: f64) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0.0;
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|task| std::fs::read_to_string(task.path().join("stat")).ok())
        .filter_map(|stat| {
            // `pid (comm) state ...`: comm may hold spaces, so split at the last ')'.
            let (head, rest) = stat.rsplit_once(')')?;
            let comm = head.split_once('(')?.1;
            if !comm.starts_with("wrk:") {
                return None;
            }
            let fields: Vec<&str> = rest.split_whitespace().collect();
            // After the comm: state is field 3, utime 14 and stime 15 (1-based in proc(5)).
            let utime: f64 = fields.get(11)?.parse().ok()?;
            let stime: f64 = fields.get(12)?.parse().ok()?;
            Some((utime + stime) / ticks_per_second)
        })
        .sum()
}

fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// One request; its latency, and whether the filter routed it (not failed open).
async fn timed(http: &reqwest::Client, url: &str, body: &[u8]) -> anyhow::Result<(Duration, bool)> {
    let started = Instant::now();
    let response = http
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_vec())
        .send()
        .await?;
    let status = response.status();
    let routed = response
        .headers()
        .get("x-switchyard-route")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| !v.starts_with("fail-open") && !v.starts_with("rejected"));
    response.bytes().await?;
    if !status.is_success() {
        bail!("{url}: {status}");
    }
    Ok((started.elapsed(), routed))
}

fn percentile(sorted_ms: &[f64], p: f64) -> f64 {
    if sorted_ms.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted_ms.len() - 1) as f64).round() as usize;
    sorted_ms[rank.min(sorted_ms.len() - 1)]
}

/// One case's measurements.
struct Row {
    mode: &'static str,
    case: String,
    isl: usize,
    plain: Vec<f64>,
    filtered: Vec<f64>,
    not_routed: usize,
    cpu_plain_ms: f64,
    cpu_filtered_ms: f64,
    /// Mean time the control plane spent per route call (its own histogram).
    control_plane_ms: f64,
    route_call_bytes: f64,
    /// Route calls that carried the body in `filter` mode.
    body_fallbacks: u64,
}

/// (sum seconds, count) of the control plane's `route_latency_seconds` histogram.
async fn route_latency_totals(stack: &Stack, http: &reqwest::Client) -> (f64, f64) {
    let url = format!("{}/metrics", stack.control_plane_url());
    let text = match http.get(&url).send().await {
        Ok(response) => response.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    (
        prom_sum(&text, "switchyard_route_latency_seconds_sum"),
        prom_sum(&text, "switchyard_route_latency_seconds_count"),
    )
}

async fn filter_stats(stack: &Stack, http: &reqwest::Client) -> HashMap<String, u64> {
    envoy_stats(http, &stack.admin_url())
        .await
        .unwrap_or_default()
}

fn stat(stats: &HashMap<String, u64>, name: &str) -> u64 {
    stats
        .get(&format!("wasmcustom.switchyard.{name}"))
        .copied()
        .unwrap_or(0)
}

/// Resident memory of a process in MiB.
fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        })
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

/// The URLs of the gateway and plain listeners.
fn urls(stack: &Stack) -> anyhow::Result<(String, String)> {
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
async fn measure(
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
    let ticks = clock_ticks();
    for (url, slot) in [(&plain_url, 0), (&filtered_url, 1)] {
        let before = worker_cpu_seconds(pid, ticks);
        let mut sent = 0;
        while sent < requests && Instant::now() < deadline {
            timed(http, url, &take()).await?;
            sent += 1;
        }
        let per_request_ms = (worker_cpu_seconds(pid, ticks) - before) * 1e3 / sent.max(1) as f64;
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

/// What a mode's stack showed besides the cases.
struct ModeSummary {
    mode: &'static str,
    rss_start_mib: f64,
    rss_end_mib: f64,
    /// `filter` mode: seconds from the first request until the VM had the tokenizer, and the
    /// worker thread's CPU seconds over that time.
    tokenizer_load: Option<(f64, f64)>,
    small_alone_ms: Vec<f64>,
    small_contended_ms: Vec<f64>,
}

/// In `filter` mode, sends one request and waits (bounded) until the VM loaded the tokenizer.
async fn load_tokenizer(
    stack: &Stack,
    http: &reqwest::Client,
    body: &[u8],
) -> anyhow::Result<(f64, f64)> {
    let (filtered_url, _) = urls(stack)?;
    let pid = stack.pid(Component::Envoy).context("envoy runs")?;
    let ticks = clock_ticks();
    let cpu_before = worker_cpu_seconds(pid, ticks);
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
        worker_cpu_seconds(pid, ticks) - cpu_before,
    ))
}

/// A small request's latency alone, and sent 20 ms after a cold 128k request (same worker
/// thread: `--concurrency 1`), [`INTERFERENCE_REPETITIONS`] times each.
async fn interference(
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

async fn run_mode(
    args: &Args,
    mode: &'static str,
    sizes: &[(&'static str, usize, usize)],
    deadline: Instant,
    rows: &mut Vec<Row>,
) -> anyhow::Result<ModeSummary> {
    let profile = if args.release {
        Profile::Release
    } else {
        Profile::Debug
    };
    let stack = start_stack(
        StackBuilder::new()
            .decode_workers(1)
            .profile(profile)
            .speed_up(SpeedUp::new(1000.0).expect("a positive speed-up"))
            .envoy_concurrency(1)
            // Cold tokenization of a 128k prompt is hundreds of milliseconds on a busy
            // machine; the bench measures routed requests, not fail-open ones.
            .route_timeout_ms(5_000)
            .filter_setting("tokenize", mode)
            .plain_listener(0),
    )
    .await;
    let http = client();
    let pid = stack.pid(Component::Envoy).context("envoy runs")?;
    let rss_start_mib = rss_mib(pid);
    let tokenizer_load = if mode == "filter" {
        let first = chat_of(2_000, "load", 0).to_string().into_bytes();
        Some(load_tokenizer(&stack, &http, &first).await?)
    } else {
        None
    };
    for &(size, bytes, isl) in sizes {
        eprintln!("{mode}: {size} warm...");
        let salt = format!("warm{size}");
        let warm = |i: usize| chat_of(bytes, &salt, i).to_string().into_bytes();
        let case = format!("{size} warm");
        rows.push(
            measure(
                &stack,
                &http,
                mode,
                case,
                isl,
                warm,
                args.requests,
                deadline,
            )
            .await?,
        );
        eprintln!("{mode}: {size} cold...");
        let cold = |i: usize| {
            chat_of(bytes, &format!("cold{mode}{size}n{i}"), 0)
                .to_string()
                .into_bytes()
        };
        let case = format!("{size} cold");
        rows.push(
            measure(
                &stack,
                &http,
                mode,
                case,
                isl,
                cold,
                args.requests,
                deadline,
            )
            .await?,
        );
    }
    eprintln!("{mode}: a small request beside a cold 128k one...");
    let big_bytes = sizes.last().map_or(0, |s| s.1);
    let (small_alone_ms, small_contended_ms) = interference(&stack, &http, mode, big_bytes).await?;
    let rss_end_mib = rss_mib(pid);
    let run_dir: &Path = stack.run_dir();
    eprintln!("{mode}: logs in {}", run_dir.display());
    Ok(ModeSummary {
        mode,
        rss_start_mib,
        rss_end_mib,
        tokenizer_load,
        small_alone_ms,
        small_contended_ms,
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let deadline = Instant::now() + Duration::from_secs(args.max_seconds);
    let tokenizer = ModelTokenizer::from_dir(&default_model_dir())?;
    let mut sizes = Vec::new();
    for (name, tokens) in SIZES {
        let (bytes, isl) = calibrate(&tokenizer, tokens)?;
        eprintln!("{name}: {bytes} bytes of messages, {isl} tokens");
        sizes.push((name, bytes, isl));
    }
    drop(tokenizer);
    let mut rows = Vec::new();
    let mut summaries = Vec::new();
    for &mode in &args.modes {
        summaries.push(run_mode(&args, mode, &sizes, deadline, &mut rows).await?);
    }
    println!(
        "| mode | prompt | ISL | pairs | plain p50 ms | gateway p50 ms | added p50 ms | plain p99 ms | gateway p99 ms | added p99 ms | control plane ms/route | worker CPU/req plain ms | worker CPU/req gateway ms | route-call bytes/req | not routed | body fallbacks |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in &rows {
        let (p50p, p50f) = (
            percentile(&row.plain, 50.0),
            percentile(&row.filtered, 50.0),
        );
        let (p99p, p99f) = (
            percentile(&row.plain, 99.0),
            percentile(&row.filtered, 99.0),
        );
        println!(
            "| {} | {} | {} | {} | {p50p:.2} | {p50f:.2} | {:.2} | {p99p:.2} | {p99f:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} | {} | {} |",
            row.mode,
            row.case,
            row.isl,
            row.plain.len(),
            p50f - p50p,
            p99f - p99p,
            row.control_plane_ms,
            row.cpu_plain_ms,
            row.cpu_filtered_ms,
            row.route_call_bytes,
            row.not_routed,
            row.body_fallbacks,
        );
    }
    println!();
    println!(
        "| mode | Envoy RSS before MiB | Envoy RSS after MiB | tokenizer load s (worker CPU s) | small request alone p50 / max ms | small request beside a cold 128k p50 / max ms |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for s in &summaries {
        let load = s.tokenizer_load.map_or("-".to_string(), |(wall, cpu)| {
            format!("{wall:.2} ({cpu:.2})")
        });
        let max = |v: &[f64]| v.last().copied().unwrap_or(f64::NAN);
        println!(
            "| {} | {:.0} | {:.0} | {load} | {:.2} / {:.2} | {:.2} / {:.2} |",
            s.mode,
            s.rss_start_mib,
            s.rss_end_mib,
            percentile(&s.small_alone_ms, 50.0),
            max(&s.small_alone_ms),
            percentile(&s.small_contended_ms, 50.0),
            max(&s.small_contended_ms),
        );
    }
    Ok(())
}
