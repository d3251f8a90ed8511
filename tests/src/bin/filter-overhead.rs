//! `filter-overhead`: what the Switchyard filter adds to a request, measured on a real stack.
//!
//! One Envoy with two listeners to the same single simulated decode worker: the gateway
//! listener with the filter (route call to the real control plane included) and a plain
//! listener without it. For each body size, requests alternate between the two listeners
//! (so machine noise hits both alike) and the client-measured latency difference is the
//! filter's cost; then each listener gets a block of requests alone while the CPU time of
//! Envoy's worker threads (`/proc/<pid>/task/*/stat`, threads named `wrk:*`) is read before
//! and after, giving worker-thread CPU per request.
//!
//! The worker is simulated (a GB200 model run 1000x faster than real time, one output token,
//! prompt prefix-cached after the first request), so its own time is small and the same for
//! both paths. Bounded: `--requests` per size and listener, `--max-seconds` overall.
//!
//! ```sh
//! cargo build -p switchyard-filter --target wasm32-wasip1 --profile wasm
//! cargo build --workspace --bins --release
//! target/release/filter-overhead --release --requests 200
//! ```

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context as _};
use switchyard_e2e::{client, prom_sum, start_stack};
use switchyard_stack::{Component, Profile, SpeedUp, Stack, StackBuilder};
use tokio::time::Instant;

/// Command-line settings (hand-parsed: three flags do not need clap here).
struct Args {
    requests: usize,
    max_seconds: u64,
    release: bool,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        requests: 200,
        max_seconds: 600,
        release: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--requests" => args.requests = it.next().context("--requests N")?.parse()?,
            "--max-seconds" => args.max_seconds = it.next().context("--max-seconds S")?.parse()?,
            "--release" => args.release = true,
            "-h" | "--help" => {
                println!(
                    "filter-overhead [--requests N (200)] [--max-seconds S (600)] [--release]"
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

/// A chat body of about `bytes` bytes of English-like prose (~4.5 bytes per token, as agentic
/// transcripts are: 1 MB is about 230k tokens, within the workers' 262k context), numbered
/// every 16 words so that no two stretches are the same text.
fn body_of(bytes: usize) -> Vec<u8> {
    const WORDS: [&str; 16] = [
        "the", "agent", "reads", "each", "file", "before", "it", "changes", "any", "line", "and",
        "then", "runs", "the", "tests", "again",
    ];
    let mut content = String::with_capacity(bytes);
    let mut i = 0u64;
    while content.len() + 120 < bytes {
        if i.is_multiple_of(16) {
            content.push_str(&format!("step {} ", i / 16));
        }
        content.push_str(WORDS[(i % 16) as usize]);
        content.push(' ');
        i += 1;
    }
    serde_json::json!({
        "model": "qwen3",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 1,
        "stream": false,
    })
    .to_string()
    .into_bytes()
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

struct Row {
    size: &'static str,
    plain: Vec<f64>,
    filtered: Vec<f64>,
    not_routed: usize,
    cpu_plain_ms: f64,
    cpu_filtered_ms: f64,
    /// Mean time the control plane spent per route call (its own histogram).
    control_plane_ms: f64,
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

async fn measure(
    stack: &Stack,
    http: &reqwest::Client,
    size: &'static str,
    bytes: usize,
    requests: usize,
    deadline: Instant,
) -> anyhow::Result<Row> {
    let body = body_of(bytes);
    let filtered_url = format!("{}/v1/chat/completions", stack.gateway_url());
    let plain_url = format!(
        "{}/v1/chat/completions",
        stack
            .plain_gateway_url()
            .context("the stack has a plain listener")?
    );
    // Warm-up: tokenizer segment cache, prefix cache, connections.
    for _ in 0..3 {
        timed(http, &filtered_url, &body).await?;
        timed(http, &plain_url, &body).await?;
    }
    let mut row = Row {
        size,
        plain: Vec::new(),
        filtered: Vec::new(),
        not_routed: 0,
        cpu_plain_ms: 0.0,
        cpu_filtered_ms: 0.0,
        control_plane_ms: 0.0,
    };
    let (sum_before, count_before) = route_latency_totals(stack, http).await;
    for _ in 0..requests {
        if Instant::now() > deadline {
            eprintln!(
                "{size}: time budget reached after {} pairs",
                row.plain.len()
            );
            break;
        }
        let (plain, _) = timed(http, &plain_url, &body).await?;
        let (filtered, routed) = timed(http, &filtered_url, &body).await?;
        row.plain.push(plain.as_secs_f64() * 1e3);
        row.filtered.push(filtered.as_secs_f64() * 1e3);
        row.not_routed += usize::from(!routed);
    }
    let (sum_after, count_after) = route_latency_totals(stack, http).await;
    row.control_plane_ms = (sum_after - sum_before) * 1e3 / (count_after - count_before).max(1.0);
    let pid = stack.pid(Component::Envoy).context("envoy runs")?;
    let ticks = clock_ticks();
    for (url, slot) in [(&plain_url, 0), (&filtered_url, 1)] {
        let before = worker_cpu_seconds(pid, ticks);
        let mut sent = 0;
        while sent < requests && Instant::now() < deadline {
            timed(http, url, &body).await?;
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

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let deadline = Instant::now() + Duration::from_secs(args.max_seconds);
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
            // Cold tokenization of a 400 KB prompt is tens of milliseconds; the bench
            // measures routed requests, not fail-open ones.
            .route_timeout_ms(5_000)
            .plain_listener(0),
    )
    .await;
    let http = client();
    let mut rows = Vec::new();
    // 1 MB: a 250k-token agentic turn, the largest the issue targets.
    for (size, bytes) in [("1 KB", 1 << 10), ("400 KB", 400 << 10), ("1 MB", 1 << 20)] {
        eprintln!("measuring {size} bodies...");
        rows.push(measure(&stack, &http, size, bytes, args.requests, deadline).await?);
    }
    println!(
        "| body | pairs | plain p50 ms | filter p50 ms | added p50 ms | plain p99 ms | filter p99 ms | added p99 ms | control plane ms/route | worker CPU/req plain ms | worker CPU/req filter ms | not routed |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
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
            "| {} | {} | {p50p:.2} | {p50f:.2} | {:.2} | {p99p:.2} | {p99f:.2} | {:.2} | {:.2} | {:.3} | {:.3} | {} |",
            row.size,
            row.plain.len(),
            p50f - p50p,
            p99f - p99p,
            row.control_plane_ms,
            row.cpu_plain_ms,
            row.cpu_filtered_ms,
            row.not_routed
        );
    }
    let run_dir: &Path = stack.run_dir();
    eprintln!("logs in {}", run_dir.display());
    Ok(())
}
