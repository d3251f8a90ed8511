//! The gateway's floor: a stand-in for the control plane that does no prompt work.
//!
//! It listens on the stopped control plane's port and answers every route call with one
//! verdict the real control plane gave before, after reading the body whole the way the
//! control plane reads it. What the gateway then adds to a request is what buffering the
//! body, the filter's copies, the route call's transfer and its answer cost with the control
//! plane's parse, template, tokenization and routing taken away: the lowest any control plane
//! that receives the body could reach on this machine.
//!
//! Envoy's health check (`/readyz`) and the filter's lifecycle reports are answered 200, so the
//! cluster stays healthy; endpoint discovery is answered 503, so Envoy keeps the endpoints the
//! real control plane gave it.

use std::convert::Infallible;
use std::net::SocketAddr;

use anyhow::Context as _;
use switchyard_control_plane::api::{declared_length, read_body};
use switchyard_protocol::lifecycle::LIFECYCLE_PATH;
use switchyard_support::http_server::serve;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use warp::http::{HeaderMap, StatusCode};
use warp::reply::Response;
use warp::{Filter, Reply};

/// The largest body the stand-in reads (the control plane's default route body limit).
const BODY_LIMIT: usize = 16 << 20;

/// A running stand-in; [`StubControlPlane::stop`] ends it.
pub(crate) struct StubControlPlane {
    shutdown: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl StubControlPlane {
    /// Serves on 127.0.0.1:`port`, answering route calls with `verdict` (a verdict's JSON).
    pub(crate) async fn start(port: u16, verdict: Vec<u8>) -> anyhow::Result<Self> {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("the stand-in binds {addr}"))?;
        let route = warp::path!("v1" / "route")
            .and(warp::post())
            .and(warp::header::headers_cloned())
            .and(warp::body::stream())
            .then(move |headers: HeaderMap, body| {
                let verdict = verdict.clone();
                async move {
                    match read_body(body, BODY_LIMIT, declared_length(&headers)).await {
                        Ok(_) => json(StatusCode::OK, verdict),
                        Err((_, refusal)) => refusal,
                    }
                }
            });
        let answered = warp::path("readyz")
            .or(warp::path::full()
                .and_then(|path: warp::path::FullPath| async move {
                    if path.as_str() == LIFECYCLE_PATH {
                        Ok(())
                    } else {
                        Err(warp::reject::not_found())
                    }
                })
                .untuple_one())
            .unify()
            .map(|| json(StatusCode::OK, b"{}".to_vec()));
        let routes = route
            .or(answered)
            .unify()
            .recover(|_| async {
                Ok::<_, Infallible>(json(StatusCode::SERVICE_UNAVAILABLE, b"{}".to_vec()))
            })
            .unify();
        let (shutdown, stop) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, routes, async {
            let _ = stop.await;
        }));
        Ok(StubControlPlane { shutdown, task })
    }

    /// Stops accepting and waits (bounded) for open connections to finish.
    pub(crate) async fn stop(self) {
        let _ = self.shutdown.send(());
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), self.task).await;
    }
}

fn json(status: StatusCode, body: Vec<u8>) -> Response {
    warp::reply::with_header(
        warp::reply::with_status(body, status),
        "content-type",
        "application/json",
    )
    .into_response()
}
