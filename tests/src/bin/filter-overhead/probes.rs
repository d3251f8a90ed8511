//! What the bench reads: one request's latency, Envoy's worker-thread CPU and RSS from
//! `/proc`, the filter's stats, the control plane's route histogram.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::bail;
use switchyard_e2e::{envoy_stats, prom_sum};
use switchyard_stack::Stack;
use tokio::time::Instant;

/// CPU time of the process's threads whose name starts with `wrk:` (Envoy's worker threads),
/// in seconds: the scheduler's nanosecond count (`/proc/<pid>/task/<tid>/schedstat`), so a
/// block of 20 requests resolves tenths of a millisecond per request, where `stat`'s clock
/// ticks (10 ms) resolved 0.5 ms. Falls back to those ticks where schedstat is missing.
pub(crate) fn worker_cpu_seconds(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0.0;
    };
    tasks
        .filter_map(Result::ok)
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|comm| comm.starts_with("wrk:"))
        })
        .filter_map(|task| {
            let from_schedstat = std::fs::read_to_string(task.path().join("schedstat"))
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
                .map(|ns| ns / 1e9);
            from_schedstat.or_else(|| ticks_seconds(&task.path()))
        })
        .sum()
}

/// User + system time from a task's `stat`, in seconds.
fn ticks_seconds(task: &std::path::Path) -> Option<f64> {
    let stat = std::fs::read_to_string(task.join("stat")).ok()?;
    // `pid (comm) state ...`: comm may hold spaces, so split at the last ')'.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the comm: state is field 3, utime 14 and stime 15 (1-based in proc(5)).
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / clock_ticks())
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
pub(crate) async fn timed(
    http: &reqwest::Client,
    url: &str,
    body: &[u8],
) -> anyhow::Result<(Duration, bool)> {
    let started = Instant::now();
    let response = http
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_vec())
        .send()
        .await?;
    let status = response.status();
    let route = response
        .headers()
        .get("x-switchyard-route")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let routed = route
        .as_deref()
        .is_some_and(|v| !v.starts_with("fail-open") && !v.starts_with("rejected"));
    let body = response.bytes().await?;
    if !status.is_success() {
        // The first bytes say whose refusal it is (the gateway's, the control plane's, the
        // worker's) and why.
        let said = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
        bail!("{url}: {status}, x-switchyard-route {route:?}: {said}");
    }
    Ok((started.elapsed(), routed))
}

pub(crate) fn percentile(sorted_ms: &[f64], p: f64) -> f64 {
    if sorted_ms.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted_ms.len() - 1) as f64).round() as usize;
    sorted_ms[rank.min(sorted_ms.len() - 1)]
}

/// (sum seconds, count) of the control plane's `route_latency_seconds` histogram.
pub(crate) async fn route_latency_totals(stack: &Stack, http: &reqwest::Client) -> (f64, f64) {
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

pub(crate) async fn filter_stats(stack: &Stack, http: &reqwest::Client) -> HashMap<String, u64> {
    envoy_stats(http, &stack.admin_url())
        .await
        .unwrap_or_default()
}

pub(crate) fn stat(stats: &HashMap<String, u64>, name: &str) -> u64 {
    stats
        .get(&format!("wasmcustom.switchyard.{name}"))
        .copied()
        .unwrap_or(0)
}

/// Resident memory of a process in MiB.
pub(crate) fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        })
        .map_or(f64::NAN, |kib| kib / 1024.0)
}
