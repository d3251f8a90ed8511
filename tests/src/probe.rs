//! Probes of the disaggregated path: what a response's `usage` says, chunked uploads, and the
//! control plane's view of worker load (to wait, bounded, until lifecycle reports freed it).

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;
use switchyard_stack::{ServingMode, Stack, StackBuilder};

use crate::{
    admin_get_json, prom_sum, sse_data, start_stack, worker_addresses, worker_metrics, Observed,
};

/// Response header naming the prefill worker of a disaggregated request.
pub const PREFILL_HEADER: &str = "x-switchyard-prefill";

/// Starts two decode and two prefill workers (the prefill workers in their own process), the
/// control plane in `conditional` mode with its default `isl_bounding` policy, and the filter
/// with `filter_settings` on top of the stack's defaults.
pub async fn disagg_stack(filter_settings: &[(&str, u64)]) -> Stack {
    let mut builder = StackBuilder::new()
        .decode_workers(2)
        .prefill_workers(2)
        .serving_mode(ServingMode::Conditional)
        // Tokenizing a cold 4k-token prompt in a debug build takes tens of milliseconds.
        .route_timeout_ms(3_000);
    for (key, value) in filter_settings {
        builder = builder.filter_setting(key, *value);
    }
    start_stack(builder).await
}

/// The addresses of the stack's prefill workers.
pub fn prefill_addresses(stack: &Stack) -> Vec<String> {
    stack
        .workers()
        .iter()
        .filter(|w| w.id.0.starts_with("prefill"))
        .map(|w| w.address.clone())
        .collect()
}

/// About 4,000 tokens of text unique to `topic`: cold on every worker, and above the default
/// 2048-token `eff_isl_threshold`, so the default policy disaggregates it.
pub fn long_prompt(topic: &str) -> String {
    let mut text = format!("Read these notes about {topic} and summarise them.\n");
    for i in 0..320u32 {
        text.push_str(&format!(
            "Note {i} on {topic}: item {i} follows item {} and precedes {}.\n",
            i.saturating_sub(1),
            i + 1
        ));
    }
    text
}

/// A streamed chat body asking for the final `usage` chunk.
pub fn streamed_chat(messages: Value, max_tokens: u32) -> Value {
    serde_json::json!({
        "model": "qwen3",
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
}

/// The `usage` object of a streamed response (its last chunk with one).
pub fn usage(response: &Observed) -> Value {
    sse_usage(&response.body())
}

/// Panics unless `response` is a complete 200 stream whose events arrived in several reads at
/// distinct times (streamed, not buffered).
pub fn assert_streamed(response: &Observed) {
    assert_eq!(response.status, 200, "body: {}", response.body());
    let data = response.sse_data();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    let arrivals = response.event_arrivals();
    assert!(
        arrivals.len() >= 3 && arrivals.last() > arrivals.first(),
        "tokens must stream in several reads at distinct times: {arrivals:?}"
    );
}

/// The sum of a worker's metric `name` from its `/metrics`; panics if the worker does not
/// answer.
pub async fn worker_metric(http: &reqwest::Client, address: &str, name: &str) -> f64 {
    let text = worker_metrics(http, address)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    prom_sum(&text, name)
}

/// The filter's stat `switchyard.<name>` from parsed Envoy `/stats` (0 when absent).
pub fn filter_stat(stats: &HashMap<String, u64>, name: &str) -> u64 {
    stats
        .get(&format!("wasmcustom.switchyard.{name}"))
        .copied()
        .unwrap_or(0)
}

/// How often and how long [`wait_until_idle`] and [`known_workers`] poll.
const POLL: Duration = Duration::from_millis(100);
const IDLE_POLLS: usize = 50;
const WORKER_POLLS: usize = 100;

/// The last non-null `usage` object of an SSE body (`Value::Null` when there is none).
pub fn sse_usage(body: &str) -> Value {
    sse_data(body)
        .iter()
        .rev()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| v.get("usage").cloned())
        .find(|u| !u.is_null())
        .unwrap_or(Value::Null)
}

/// The assistant text of a streamed chat response (the `delta.content` pieces joined).
pub fn assistant_text(response: &Observed) -> String {
    response
        .sse_data()
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect()
}

/// POSTs `body` with chunked transfer encoding, 8 KiB at a time with 20 ms between pieces, so
/// Envoy sees several data frames and no `content-length`. Bounded by `timeout` until the
/// response headers.
///
/// # Errors
/// A message if the request fails or times out.
pub async fn post_chunked(
    http: &reqwest::Client,
    url: &str,
    body: Vec<u8>,
    timeout: Duration,
) -> Result<reqwest::Response, String> {
    let pieces: Vec<Vec<u8>> = body.chunks(8 << 10).map(<[u8]>::to_vec).collect();
    let stream = futures::stream::unfold(pieces.into_iter(), |mut pieces| async move {
        let piece = pieces.next()?;
        tokio::time::sleep(Duration::from_millis(20)).await;
        Some((Ok::<_, std::io::Error>(piece), pieces))
    });
    let request = http
        .post(url)
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(stream));
    tokio::time::timeout(timeout, request.send())
        .await
        .map_err(|_| format!("chunked POST {url} did not answer within {timeout:?}"))?
        .map_err(|e| format!("chunked POST {url}: {e}"))
}

/// Posts `body` to `path` at `base` (`http://host:port`) chunked, in one write, as fast as
/// the socket takes it (as curl sends a file), over HTTP/1.1 with `connection: close`;
/// returns the response's head and body. Bounded by `timeout`.
///
/// # Errors
/// A message when the gateway cannot be reached or does not answer in time.
pub async fn raw_chunked_post(
    base: &str,
    path: &str,
    body: &str,
    timeout: Duration,
) -> Result<(String, String), String> {
    raw_post(base, path, body, RawFraming::Chunked, timeout).await
}

/// POSTs `body` to `path` as an HTTP/1.0 client does (nginx's default `proxy_http_version`,
/// ApacheBench): a `content-length` body, the connection closed after the answer. Returns
/// the response's head and body.
///
/// # Errors
/// As [`raw_chunked_post`].
pub async fn raw_http10_post(
    base: &str,
    path: &str,
    body: &str,
    timeout: Duration,
) -> Result<(String, String), String> {
    raw_post(base, path, body, RawFraming::Http10, timeout).await
}

/// How a raw POST frames its body.
enum RawFraming {
    /// HTTP/1.1, chunked in one chunk, `connection: close`.
    Chunked,
    /// HTTP/1.0 with `content-length`.
    Http10,
}

async fn raw_post(
    base: &str,
    path: &str,
    body: &str,
    framing: RawFraming,
    timeout: Duration,
) -> Result<(String, String), String> {
    let authority = base.trim_start_matches("http://");
    let (version, framing_headers, chunk_head, chunk_tail) = match framing {
        RawFraming::Chunked => (
            "HTTP/1.1",
            "transfer-encoding: chunked\r\nconnection: close".to_string(),
            format!("{:x}\r\n", body.len()),
            "\r\n0\r\n\r\n",
        ),
        RawFraming::Http10 => (
            "HTTP/1.0",
            format!("content-length: {}", body.len()),
            String::new(),
            "",
        ),
    };
    let mut request = format!(
        "POST {path} {version}\r\nhost: {authority}\r\ncontent-type: application/json\r\n\
         {framing_headers}\r\n\r\n{chunk_head}"
    )
    .into_bytes();
    request.extend_from_slice(body.as_bytes());
    request.extend_from_slice(chunk_tail.as_bytes());
    raw_exchange(authority, path, &request, timeout).await
}

/// POSTs each of `bodies` to `path` on one HTTP/1.1 connection, pipelined in one write (the
/// last one asks the gateway to close after it), and returns everything the gateway answered
/// on that connection. Bounded by `timeout`.
///
/// # Errors
/// As [`raw_chunked_post`].
pub async fn raw_pipelined_posts(
    base: &str,
    path: &str,
    bodies: &[&str],
    timeout: Duration,
) -> Result<String, String> {
    let authority = base.trim_start_matches("http://");
    let mut request = Vec::new();
    for (i, body) in bodies.iter().enumerate() {
        let close = if i + 1 == bodies.len() {
            "connection: close\r\n"
        } else {
            ""
        };
        request.extend_from_slice(
            format!(
                "POST {path} HTTP/1.1\r\nhost: {authority}\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\n{close}\r\n{body}",
                body.len()
            )
            .as_bytes(),
        );
    }
    let (head, body) = raw_exchange(authority, path, &request, timeout).await?;
    Ok(format!("{head}\r\n\r\n{body}"))
}

/// Writes `request` on a new connection to `authority` and reads the answer until the
/// gateway closes it, within `timeout`; the answer's head and body (`path` names the request
/// in errors).
///
/// # Errors
/// No connection, no answer in time, or an answer without a response head.
pub async fn raw_exchange(
    authority: &str,
    path: &str,
    request: &[u8],
    timeout: Duration,
) -> Result<(String, String), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(authority)
        .await
        .map_err(|e| format!("connect {authority}: {e}"))?;
    let exchange = async {
        // The gateway may answer and close before it has read it all: a failed write is fine.
        let _ = socket.write_all(request).await;
        let mut answer = Vec::new();
        let _ = socket.read_to_end(&mut answer).await;
        answer
    };
    let answer = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| format!("POST {path}: no answer within {timeout:?}"))?;
    let text = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("POST {path}: no response head in {text:?}"))?;
    Ok((head.to_string(), body.to_string()))
}

/// Waits (bounded, 10 s) until the control plane lists every worker of the stack; returns
/// worker id -> address.
///
/// # Errors
/// A message naming what was last seen.
pub async fn known_workers(
    stack: &Stack,
    http: &reqwest::Client,
) -> Result<HashMap<String, String>, String> {
    let mut last = HashMap::new();
    for _ in 0..WORKER_POLLS {
        if let Ok(found) = worker_addresses(http, stack).await {
            if stack.workers().iter().all(|w| found.contains_key(&w.id.0)) {
                return Ok(found);
            }
            last = found;
        }
        tokio::time::sleep(POLL).await;
    }
    Err(format!(
        "the control plane never listed every worker; last saw {last:?}"
    ))
}

/// One worker in the control plane's `GET /v1/workers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkerLoad {
    /// Requests the control plane believes in flight plus active KV blocks it predicts.
    pub busy: u64,
    /// KV blocks the index holds for the worker.
    pub cached_blocks: u64,
}

/// `GET /v1/workers` as worker id -> [`WorkerLoad`].
///
/// # Errors
/// A message if the call fails or the body is not JSON.
pub async fn worker_loads(
    stack: &Stack,
    http: &reqwest::Client,
) -> Result<HashMap<String, WorkerLoad>, String> {
    let json = admin_get_json(http, stack, "/v1/workers").await?;
    Ok(parse_worker_loads(&json))
}

fn parse_worker_loads(json: &Value) -> HashMap<String, WorkerLoad> {
    json["workers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|w| {
            let id = w["info"]["worker_id"].as_str()?.to_string();
            let busy = w["in_flight"].as_u64().unwrap_or(0)
                + w["load"]["active_blocks"].as_u64().unwrap_or(0);
            let cached_blocks = w["cached_blocks"].as_u64().unwrap_or(0);
            Some((
                id,
                WorkerLoad {
                    busy,
                    cached_blocks,
                },
            ))
        })
        .collect()
}

/// Waits (at most 5 s) until no worker has requests in flight or active KV blocks in the
/// control plane's view. The control plane only learns that a request finished from the
/// filter's lifecycle reports (its own expiry is 600 s), so this also checks they arrive.
///
/// # Errors
/// A message with the last view when load is still there after 5 s.
pub async fn wait_until_idle(stack: &Stack, http: &reqwest::Client) -> Result<(), String> {
    let mut last = HashMap::new();
    for _ in 0..IDLE_POLLS {
        last = worker_loads(stack, http).await?;
        if last.values().all(|w| w.busy == 0) {
            return Ok(());
        }
        tokio::time::sleep(POLL).await;
    }
    Err(format!("predicted load not freed within 5 s: {last:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_real_usage_is_found() {
        let body =
            "data: {\"usage\":{\"prompt_tokens\":1}}\n\ndata: {\"usage\":null}\n\ndata: [DONE]\n\n";
        assert_eq!(sse_usage(body)["prompt_tokens"], 1);
        assert!(sse_usage("data: [DONE]").is_null());
    }

    #[test]
    fn worker_loads_add_in_flight_and_active_blocks() {
        let json = serde_json::json!({"workers": [
            {"info": {"worker_id": "decode-0"}, "in_flight": 1, "load": {"active_blocks": 5}, "cached_blocks": 9},
            {"info": {"worker_id": "decode-1"}, "in_flight": 0, "load": {}, "cached_blocks": 0}
        ]});
        let loads = parse_worker_loads(&json);
        assert_eq!(
            loads["decode-0"],
            WorkerLoad {
                busy: 6,
                cached_blocks: 9
            }
        );
        assert_eq!(loads["decode-1"].busy, 0);
    }
}
