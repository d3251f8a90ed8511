//! A tiny real OpenAI-style SSE server for the load generator's tests (warp on 127.0.0.1:0).
//! It streams like vLLM (`/v1/chat/completions` and `/v1/completions`) and fails on demand,
//! selected by `max_tokens`. It runs as a task of the test's runtime and stops with it.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::channel::mpsc;
use futures::StreamExt;
use serde_json::{json, Value};
use warp::Filter;

/// The server waits this long before the first token...
pub const FIRST_TOKEN_MS: u64 = 60;
/// ...and this long between tokens.
pub const TOKEN_GAP_MS: u64 = 15;
/// `max_tokens` that makes the server answer 503.
pub const FAIL_STATUS: u32 = 503;
/// `max_tokens` that makes the server send an error inside the stream.
pub const FAIL_IN_STREAM: u32 = 2;
/// `max_tokens` that makes the server close the stream early.
pub const FAIL_TRUNCATED: u32 = 3;
/// `max_tokens` that makes the server ignore `stream: true` and answer one JSON document.
pub const FAIL_NOT_STREAMED: u32 = 517;

/// Concurrency the server saw.
#[derive(Default)]
pub struct ServerState {
    /// Streams open now.
    pub in_flight: AtomicUsize,
    /// Most streams open at once.
    pub max_in_flight: AtomicUsize,
}

/// Decrements the in-flight count when a stream ends, however it ends.
struct InFlight(Arc<ServerState>);
impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

fn sse(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

/// Streams a completion like vLLM: `n` content chunks, a usage chunk, `[DONE]`. The prompt
/// token count is the number of words in the prompt (the test vocabulary's rule, without a
/// chat template).
fn respond(body: Value, state: Arc<ServerState>) -> warp::reply::Response {
    use warp::Reply;
    let n = body["max_tokens"].as_u64().unwrap_or(1) as u32;
    if n == FAIL_STATUS {
        let reply = warp::reply::json(&json!({"error": {"message": "no capacity"}}));
        return warp::reply::with_status(reply, warp::http::StatusCode::SERVICE_UNAVAILABLE)
            .into_response();
    }
    if n == FAIL_NOT_STREAMED {
        let completion =
            json!({"choices": [{"message": {"content": "a b c d e"}, "finish_reason": "stop"}]});
        return warp::reply::json(&completion).into_response();
    }
    let chat = body.get("messages").is_some();
    let prompt = if chat {
        &body["messages"][0]["content"]
    } else {
        &body["prompt"]
    };
    let words = prompt.as_str().unwrap_or("").split_whitespace().count();
    let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    state.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let guard = InFlight(state);
    let (tx, rx) = mpsc::unbounded::<Bytes>();
    tokio::spawn(async move {
        let _guard = guard;
        tokio::time::sleep(Duration::from_millis(FIRST_TOKEN_MS)).await;
        for i in 0..n {
            if i > 0 {
                tokio::time::sleep(Duration::from_millis(TOKEN_GAP_MS)).await;
            }
            let finish = if i + 1 == n {
                json!("length")
            } else {
                Value::Null
            };
            let chunk = if chat {
                json!({"choices": [{"delta": {"content": " tok"}, "finish_reason": finish}]})
            } else {
                json!({"choices": [{"text": " tok", "finish_reason": finish}]})
            };
            if tx.unbounded_send(sse(&chunk)).is_err() {
                return;
            }
            if n == FAIL_IN_STREAM {
                let _ = tx.unbounded_send(sse(&json!({"error": {"message": "engine died"}})));
                return;
            }
            if n == FAIL_TRUNCATED {
                return; // close without finish_reason or [DONE]
            }
        }
        let usage = json!({"choices": [], "usage": {"prompt_tokens": words, "completion_tokens": n,
            "prompt_tokens_details": {"cached_tokens": words / 2}}});
        let _ = tx.unbounded_send(sse(&usage));
        let _ = tx.unbounded_send(Bytes::from("data: [DONE]\n\n"));
    });
    let stream = warp::reply::stream(rx.map(Ok::<_, Infallible>));
    let reply = warp::reply::with_header(stream, "content-type", "text/event-stream");
    let reply = warp::reply::with_header(reply, "x-switchyard-route", "bypass");
    warp::reply::with_header(reply, "x-switchyard-worker", "sim-0").into_response()
}

/// Starts the server on a free port of 127.0.0.1.
pub async fn start_server() -> (SocketAddr, Arc<ServerState>) {
    let state = Arc::new(ServerState::default());
    let shared = Arc::clone(&state);
    let paths = warp::path!("v1" / "chat" / "completions").or(warp::path!("v1" / "completions"));
    let route = warp::post()
        .and(paths.unify())
        .and(warp::body::json())
        .map(move |body: Value| respond(body, Arc::clone(&shared)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(warp::serve(route).incoming(listener).run());
    (addr, state)
}
