//! The HTTP accept loop of the control plane and the simulated workers: hyper serves warp
//! routes on each connection until shutdown (feature `http-server`).
//!
//! Why not `warp::serve`:
//! - It leaves Nagle's algorithm on. A streamed answer (a worker's SSE tokens, or a small
//!   reply after headers written apart) then waits on the peer's delayed ACK: up to 40 ms
//!   with every token held back and sent at once, which a simulated worker's timings must not
//!   show and a route call cannot afford. Every accepted socket here has `TCP_NODELAY`.
//! - It logs every failed connection at ERROR, and the commonest failure is expected: the
//!   filter abandoning a route call at its timeout closes the connection mid-request
//!   (`IncompleteMessage`), once per late verdict. Connection errors are the peer's doing
//!   (gone, reset, malformed HTTP), so this loop logs them at debug and keeps ERROR for what
//!   an operator must act on: the listener failing (out of file descriptors, say).
//!
//! Headers get no read timeout: hyper's would also close every idle keep-alive connection
//! once it ran out, and Envoy keeps its upstream connections pooled for an hour by default, so
//! a request sent as the server closed one would fail (a fail-open for a route call). Bodies
//! are bounded by the handlers that read them (the control plane's `read_body`).

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use warp::reply::Response;
use warp::Filter;

/// Pause after an accept error that is not about one connection (EMFILE and the like), so a
/// full descriptor table is not spun on.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves `routes` on `listener` until `shutdown` resolves, then stops accepting and resolves
/// once every open connection has finished (the caller bounds that wait).
pub async fn serve<F>(listener: TcpListener, routes: F, shutdown: impl Future<Output = ()>)
where
    F: Filter<Extract = (Response,), Error = Infallible> + Clone + Send + Sync + 'static,
{
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    // A socket that refuses it still serves, only slower: not worth a refusal.
                    if let Err(e) = stream.set_nodelay(true) {
                        tracing::debug!(error = %e, "cannot set TCP_NODELAY on a connection");
                    }
                    stream
                }
                Err(e) if is_per_connection(&e) => {
                    tracing::debug!(error = %e, "a connection failed while being accepted");
                    continue;
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot accept connections; retrying");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let service = TowerToHyperService::new(warp::service(routes.clone()));
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let builder = Builder::new(TokioExecutor::new());
            let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
            if let Err(e) = watcher.watch(connection).await {
                tracing::debug!(error = %e, "connection ended with an error (peer gone or malformed request)");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// Accept errors that concern one connection only (it was reset before it was accepted).
fn is_per_connection(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    )
}

/// The methods each endpoint of a service answers, as `(path, "GET, HEAD")`, for the `Allow`
/// header a 405 must carry (RFC 9110, section 15.5.6). A path ending in `/*` stands for every
/// path under it.
pub type Endpoints = &'static [(&'static str, &'static str)];

/// The methods `endpoints` lists for `path`, if it lists the path.
pub fn allowed_methods(endpoints: Endpoints, path: &str) -> Option<&'static str> {
    endpoints.iter().find_map(|&(pattern, methods)| {
        let matches = match pattern.strip_suffix('*') {
            Some(prefix) => path.len() > prefix.len() && path.starts_with(prefix),
            None => path == pattern,
        };
        matches.then_some(methods)
    })
}

/// `routes` with an `Allow` header on each 405 they answer, from `endpoints`. warp's
/// method-mismatch rejection does not carry the path, so the header is added once the answer
/// is made, where the path is still at hand.
pub fn with_allow<F>(
    endpoints: Endpoints,
    routes: F,
) -> impl Filter<Extract = (Response,), Error = Infallible> + Clone + Send + Sync + 'static
where
    F: Filter<Extract = (Response,), Error = Infallible> + Clone + Send + Sync + 'static,
{
    warp::path::full()
        .and(routes)
        .map(move |path: warp::path::FullPath, mut reply: Response| {
            if reply.status() == warp::http::StatusCode::METHOD_NOT_ALLOWED {
                if let Some(methods) = allowed_methods(endpoints, path.as_str()) {
                    reply.headers_mut().insert(
                        warp::http::header::ALLOW,
                        warp::http::HeaderValue::from_static(methods),
                    );
                }
            }
            reply
        })
}

/// One request a test sends to check a service's `Allow` headers: `method` on `path`, and
/// what the answer must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MethodProbe {
    /// A path of the endpoint (a `/*` pattern filled in).
    pub path: String,
    /// The method sent.
    pub method: &'static str,
    /// `None` when the endpoint serves `method`; else the `Allow` its 405 must carry.
    pub refused_with_allow: Option<&'static str>,
}

impl MethodProbe {
    /// Checks an answer's status and `Allow` header against the probe.
    ///
    /// # Errors
    /// What is wrong, naming the method and path.
    pub fn check(&self, status: u16, allow: Option<&str>) -> Result<(), String> {
        let (method, path) = (self.method, &self.path);
        match self.refused_with_allow {
            None if status == 405 => Err(format!("{method} {path} is listed as served: 405")),
            None => Ok(()),
            Some(_) if status != 405 => Err(format!("{method} {path} is not listed: {status}")),
            Some(expected) if allow != Some(expected) => Err(format!(
                "{method} {path}: Allow {allow:?}, expected {expected:?}"
            )),
            Some(_) => Ok(()),
        }
    }
}

/// The requests that check every endpoint of `endpoints` with each of GET, HEAD, POST, PUT,
/// DELETE and PATCH: a service must serve the methods its table lists and refuse the others
/// with an `Allow` naming exactly those, so the table cannot drift from its routes.
pub fn method_probes(endpoints: Endpoints) -> Vec<MethodProbe> {
    const METHODS: [&str; 6] = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH"];
    endpoints
        .iter()
        .flat_map(|&(pattern, allowed)| {
            let path = match pattern.strip_suffix('*') {
                Some(prefix) => format!("{prefix}probe"),
                None => pattern.to_string(),
            };
            METHODS.into_iter().map(move |method| MethodProbe {
                path: path.clone(),
                method,
                refused_with_allow: (!allowed.split(", ").any(|m| m == method)).then_some(allowed),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_cover_every_method_and_check_the_allow_header() {
        let probes = method_probes(ENDPOINTS);
        assert_eq!(probes.len(), 12);
        let post = &probes[2];
        assert_eq!((post.path.as_str(), post.method), ("/v1/route", "POST"));
        assert_eq!(post.refused_with_allow, None);
        assert!(post.check(200, None).is_ok());
        assert!(post.check(405, Some("POST")).is_err());
        let get = &probes[0];
        assert_eq!(get.refused_with_allow, Some("POST"));
        assert!(get.check(405, Some("POST")).is_ok());
        assert!(get.check(405, None).is_err());
        assert!(get.check(404, Some("POST")).is_err());
        assert_eq!(probes[6].path, "/files/probe");
        assert_eq!(
            probes[7].refused_with_allow, None,
            "HEAD is listed for files"
        );
    }

    const ENDPOINTS: Endpoints = &[("/v1/route", "POST"), ("/files/*", "GET, HEAD")];

    #[test]
    fn an_endpoint_is_found_by_its_path_or_the_prefix_it_falls_under() {
        assert_eq!(allowed_methods(ENDPOINTS, "/v1/route"), Some("POST"));
        assert_eq!(allowed_methods(ENDPOINTS, "/v1/route/x"), None);
        assert_eq!(allowed_methods(ENDPOINTS, "/files/a.js"), Some("GET, HEAD"));
        assert_eq!(allowed_methods(ENDPOINTS, "/files/"), None);
        assert_eq!(allowed_methods(ENDPOINTS, "/nope"), None);
    }
}
