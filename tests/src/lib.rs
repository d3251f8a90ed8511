//! End-to-end test harness: a real local stack (Envoy with the filter, nats-server, the
//! control plane, simulated workers) from `switchyard-stack`, and client helpers that record
//! what a person with curl would see: status, headers, and when each SSE chunk arrived.
//!
//! Nothing is built here. The tests need the filter and the binaries built first:
//! `cargo build -p switchyard-filter --target wasm32-wasip1 --profile wasm && cargo build
//! --workspace --bins`; a missing artifact fails the test with a message naming that command.
#![deny(missing_docs)]

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use reqwest::header::HeaderMap;
use serde_json::Value;
use switchyard_stack::{Stack, StackBuilder, StackError};
use tokio::time::Instant;

pub use switchyard_stack::{Component, Signal};

pub mod browser;
pub mod drill;
pub mod probe;
pub mod vllm;

/// The command that builds everything the end-to-end tests run.
pub const BUILD_COMMAND: &str = "cargo build -p switchyard-filter --target wasm32-wasip1 --profile wasm && cargo build --workspace --bins";

/// Response header the filter sets with the destination it routed to.
pub const DESTINATION_RESPONSE_HEADER: &str = "x-switchyard-destination";
/// The response header naming the upstream that served a request away from its destination.
pub const UPSTREAM_HEADER: &str = "x-switchyard-upstream";
/// Response header every simulated worker sets with its id.
pub const WORKER_HEADER: &str = "x-switchyard-worker";

/// Starts a stack, or panics with a message that says what to build or where the logs are.
/// Installs the signal watcher that stops every stack child on SIGINT/SIGTERM. The run directory is removed when the test passes and kept (and printed) when it fails.
pub async fn start_stack(builder: StackBuilder) -> Stack {
    // Ctrl-C or a SIGTERM to the test binary must not orphan Envoy, NATS and the rest.
    switchyard_stack::stop_children_on_signal();
    match builder.keep_logs(false).start().await {
        Ok(stack) => {
            eprintln!("stack up; logs in {}", stack.run_dir().display());
            stack
        }
        Err(e @ StackError::MissingArtifact { .. }) => {
            panic!(
                "{e}\nThe end-to-end tests build nothing themselves; run first:\n  {BUILD_COMMAND}"
            )
        }
        Err(e) => panic!("the local stack did not start: {e}"),
    }
}

/// Sends `signal` (`-TERM`, `-KILL`, ...) to the whole process group led by `leader`: a
/// child started with `process_group(0)` and the helpers it forked.
pub fn signal_group(leader: u32, signal: &str) {
    let _ = std::process::Command::new("kill")
        .args([signal, "--", &format!("-{leader}")])
        .stderr(std::process::Stdio::null())
        .status();
}

/// A client for loopback calls: no proxy from the environment, no overall timeout (streams
/// are bounded by [`post_observed`]'s own timeout).
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(Duration::from_secs(5))
        .build()
        .expect("a reqwest client with default TLS-less settings builds")
}

/// A chat completion request body.
pub fn chat_body(prompt: &str, max_tokens: u32, stream: bool) -> Value {
    serde_json::json!({
        "model": "qwen3",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": stream,
    })
}

/// One network read of a streamed response.
#[derive(Debug, Clone)]
pub struct Chunk {
    /// When it arrived, from sending the request.
    pub at: Duration,
    /// Its bytes, as text.
    pub text: String,
}

/// A response as the client saw it.
#[derive(Debug)]
pub struct Observed {
    /// HTTP status.
    pub status: u16,
    /// Response headers.
    pub headers: HeaderMap,
    /// Body reads in arrival order.
    pub chunks: Vec<Chunk>,
}

impl Observed {
    /// A response header as a string ("" when absent).
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    /// The whole body.
    pub fn body(&self) -> String {
        self.chunks.iter().map(|c| c.text.as_str()).collect()
    }

    /// The SSE `data:` payloads, in order.
    pub fn sse_data(&self) -> Vec<String> {
        sse_data(&self.body())
    }

    /// Arrival times of the reads that carried at least one SSE `data:` event.
    pub fn event_arrivals(&self) -> Vec<Duration> {
        self.chunks
            .iter()
            .filter(|c| c.text.contains("data:"))
            .map(|c| c.at)
            .collect()
    }
}

/// The `data:` payloads of an SSE body.
pub fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(|data| data.trim().to_string())
        .filter(|data| !data.is_empty())
        .collect()
}

/// POSTs `body` as JSON to `url` with extra headers and reads the whole response, recording
/// when each read arrived. Bounded by `timeout` overall.
///
/// # Errors
/// A message saying which step failed or timed out.
pub async fn post_observed(
    client: &reqwest::Client,
    url: &str,
    body: &Value,
    headers: &[(&str, &str)],
    timeout: Duration,
) -> Result<Observed, String> {
    post_raw_observed(client, url, body.to_string().into_bytes(), headers, timeout).await
}

/// As [`post_observed`], with the body as raw bytes (to send malformed JSON).
///
/// # Errors
/// A message saying which step failed or timed out.
pub async fn post_raw_observed(
    client: &reqwest::Client,
    url: &str,
    body: Vec<u8>,
    headers: &[(&str, &str)],
    timeout: Duration,
) -> Result<Observed, String> {
    let started = Instant::now();
    let work = async {
        let mut request = client
            .post(url)
            .header("content-type", "application/json")
            .body(body);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request
            .send()
            .await
            .map_err(|e| format!("POST {url}: {e}"))?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let mut chunks = Vec::new();
        let mut stream = response.bytes_stream();
        while let Some(next) = stream.next().await {
            let bytes = next.map_err(|e| format!("reading the body of POST {url}: {e}"))?;
            chunks.push(Chunk {
                at: started.elapsed(),
                text: String::from_utf8_lossy(&bytes).into_owned(),
            });
        }
        Ok(Observed {
            status,
            headers,
            chunks,
        })
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| format!("POST {url} did not finish within {timeout:?}"))?
}

/// `GET /v1/workers` on the stack's control-plane admin API (with the run's admin token) as
/// worker id -> address. Accepts any JSON shape whose objects carry `worker_id` and `address`
/// strings.
///
/// # Errors
/// A message if the call fails or the body is not JSON.
pub async fn worker_addresses(
    client: &reqwest::Client,
    stack: &Stack,
) -> Result<HashMap<String, String>, String> {
    let json = admin_get_json(client, stack, "/v1/workers").await?;
    let mut found = HashMap::new();
    collect_workers(&json, &mut found);
    Ok(found)
}

/// `GET path` on the stack's control-plane admin API with the run's admin token, as JSON
/// whatever the status.
///
/// # Errors
/// A message naming the URL if the call fails or the body is not JSON.
pub async fn admin_get_json(
    client: &reqwest::Client,
    stack: &Stack,
    path: &str,
) -> Result<Value, String> {
    replica_admin_get_json(client, stack, 0, path).await
}

/// As [`admin_get_json`], on control-plane replica `replica`'s admin API.
///
/// # Errors
/// A message naming the URL if the call fails or the body is not JSON.
pub async fn replica_admin_get_json(
    client: &reqwest::Client,
    stack: &Stack,
    replica: usize,
    path: &str,
) -> Result<Value, String> {
    let url = format!("{}{path}", stack.control_plane_replica_admin_url(replica));
    let response = client
        .get(&url)
        .bearer_auth(stack.control_plane_admin_token())
        .send()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    let text = response
        .text()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    serde_json::from_str(&text).map_err(|e| format!("GET {url}: {e}"))
}

fn collect_workers(value: &Value, found: &mut HashMap<String, String>) {
    match value {
        Value::Object(map) => {
            if let (Some(Value::String(id)), Some(Value::String(address))) =
                (map.get("worker_id"), map.get("address"))
            {
                found.insert(id.clone(), address.clone());
            }
            map.values().for_each(|v| collect_workers(v, found));
        }
        Value::Array(items) => items.iter().for_each(|v| collect_workers(v, found)),
        _ => {}
    }
}

/// Envoy admin `/stats` as name -> value (counters and gauges; histograms are skipped).
///
/// # Errors
/// A message if the admin call fails.
pub async fn envoy_stats(
    client: &reqwest::Client,
    admin_url: &str,
) -> Result<HashMap<String, u64>, String> {
    let text = get_text(client, &format!("{admin_url}/stats")).await?;
    Ok(parse_stats(&text))
}

/// `GET http://<address>/metrics` of a worker (Prometheus text).
///
/// # Errors
/// A message if the call fails.
pub async fn worker_metrics(client: &reqwest::Client, address: &str) -> Result<String, String> {
    get_text(client, &format!("http://{address}/metrics")).await
}

/// `GET url` and its body as text, whatever the status.
///
/// # Errors
/// A message naming `url` if the call or reading the body fails.
pub async fn get_text(client: &reqwest::Client, url: &str) -> Result<String, String> {
    let response = client
        .get(url)
        .send()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    response.text().await.map_err(|e| format!("GET {url}: {e}"))
}

/// `GET url` and its body as JSON, whatever the status.
///
/// # Errors
/// A message naming `url` if the call fails or the body is not JSON.
pub async fn get_json(client: &reqwest::Client, url: &str) -> Result<Value, String> {
    let text = get_text(client, url).await?;
    serde_json::from_str(&text).map_err(|e| format!("GET {url}: {e}"))
}

/// Checks, from the control plane's `/metrics`, that its KV index holds stored chains' heads
/// only in its hash table: every `Stored` event so far named its parent's engine id (see
/// `docs/kv-index.md`, "Heads only"), and some chain is longer than its head.
///
/// # Errors
/// What the metrics showed otherwise, or why they could not be read.
pub async fn index_keeps_heads_only(
    client: &reqwest::Client,
    control_plane_url: &str,
) -> Result<(), String> {
    let metrics = get_text(client, &format!("{control_plane_url}/metrics")).await?;
    let table = prom_sum(&metrics, "switchyard_index_table_hashes");
    let hashes = prom_sum(&metrics, "switchyard_index_hashes");
    let every_hash = prom_sum(&metrics, "switchyard_index_every_hash");
    if every_hash != 0.0 || table < 1.0 || table >= hashes {
        return Err(format!(
            "the index keeps every hash ({every_hash}), or not only heads: {table} table \
             entries for {hashes} hashes"
        ));
    }
    Ok(())
}

/// The sum of every sample of metric `name` (any labels) in Prometheus text; 0 when absent.
pub fn prom_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let value = match rest.strip_prefix('{') {
                Some(labelled) => labelled.rsplit_once('}')?.1,
                None if rest.starts_with(' ') => rest,
                None => return None,
            };
            value.trim().parse::<f64>().ok()
        })
        .sum()
}

/// Parses Envoy's text `/stats` lines (`name: value`).
pub fn parse_stats(text: &str) -> HashMap<String, u64> {
    text.lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(": ")?;
            Some((name.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

/// Polls `probe` every 100 ms until it holds; panics naming `what` when `timeout` passes
/// first.
pub async fn eventually<F, Fut>(what: &str, timeout: Duration, mut probe: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !probe().await {
        assert!(Instant::now() < deadline, "not within {timeout:?}: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// As [`eventually`], with a probe that says what it saw: the panic after `timeout` shows
/// the last `Err`.
pub async fn eventually_ok<F, Fut>(what: &str, timeout: Duration, mut probe: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match probe().await {
            Ok(()) => return,
            Err(seen) => assert!(
                Instant::now() < deadline,
                "not within {timeout:?}: {what}; last saw {seen}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_payloads_are_read_across_lines() {
        let body = "data: {\"a\":1}\n\ndata: {\"a\":2}\n\n: comment\ndata: [DONE]\n\n";
        assert_eq!(sse_data(body), vec!["{\"a\":1}", "{\"a\":2}", "[DONE]"]);
    }

    #[test]
    fn workers_are_found_in_nested_json() {
        let json = serde_json::json!({"workers": [
            {"info": {"worker_id": "decode-0", "address": "127.0.0.1:1"}, "in_flight": 0},
            {"info": {"worker_id": "decode-1", "address": "127.0.0.1:2"}}
        ]});
        let mut found = HashMap::new();
        collect_workers(&json, &mut found);
        assert_eq!(found.len(), 2);
        assert_eq!(found["decode-1"], "127.0.0.1:2");
    }

    #[test]
    fn prometheus_samples_are_summed_by_exact_name() {
        let text =
            "# HELP x_total help\nx_total{a=\"1\"} 2\nx_total{a=\"2\"} 3\nx_total_more 9\ny 1.5\n";
        assert_eq!(prom_sum(text, "x_total"), 5.0);
        assert_eq!(prom_sum(text, "y"), 1.5);
        assert_eq!(prom_sum(text, "z"), 0.0);
    }

    #[test]
    fn stats_lines_parse() {
        let stats =
            parse_stats("wasmcustom.switchyard.fail_open_total: 3\ncluster.x.hist: P0(nan,1)\n");
        assert_eq!(stats.get("wasmcustom.switchyard.fail_open_total"), Some(&3));
        assert_eq!(stats.len(), 1);
    }
}
