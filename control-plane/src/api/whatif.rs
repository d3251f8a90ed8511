//! `GET /whatif/<file>` (admin listener): the status page's what-if module, the JavaScript
//! glue and the wasm that `scripts/build-whatif.sh` writes into one directory
//! (`--whatif-dir`). The module is the policy's code built for the browser (`whatif/`), so
//! the page re-decides recorded verdicts exactly as the router decides them.
//!
//! Served without the admin token: the files are the same build for everyone and hold no
//! state; the records they work on come from `/v1/status`, which needs the token. Only the
//! two names the page asks for are served, read on each request (a rebuild shows on the next
//! page load, and nothing is held in memory between loads).

use std::path::Path;
use std::sync::Arc;

use warp::http::StatusCode;
use warp::reply::Response;
use warp::Reply;

use super::{error_reply, ApiState};

/// The module's files, by the name the page asks for, with their content types: a module
/// script must be served as JavaScript, and the wasm as `application/wasm` for the browser to
/// compile it while it downloads.
pub const FILES: [(&str, &str); 2] = [
    ("switchyard_whatif.js", "text/javascript; charset=utf-8"),
    ("switchyard_whatif_bg.wasm", "application/wasm"),
];

/// Where the module is, if the control plane was given one.
pub type WhatIfDir = Option<Arc<Path>>;

/// Whether `dir` holds every file of the module (logged at start).
pub fn is_complete(dir: &Path) -> bool {
    FILES.iter().all(|(name, _)| dir.join(name).is_file())
}

/// `GET /whatif/<name>`.
pub async fn file(name: String, state: ApiState) -> Response {
    let Some((name, content_type)) = FILES.iter().find(|(known, _)| *known == name) else {
        state.metrics.bad_request("not_found");
        return error_reply(StatusCode::NOT_FOUND, "not_found", "no such endpoint");
    };
    let unavailable = |why: String| {
        let code = "whatif_unavailable";
        state.metrics.bad_request(code);
        error_reply(StatusCode::NOT_FOUND, code, why)
    };
    let Some(dir) = &state.whatif_dir else {
        return unavailable(
            "the control plane serves no what-if module: start it with --whatif-dir (built by scripts/build-whatif.sh)".into(),
        );
    };
    let path = dir.join(name);
    match tokio::fs::read(&path).await {
        Ok(bytes) => {
            let reply = warp::reply::with_header(bytes, "content-type", *content_type);
            // Revalidated on every load: a rebuilt module must not meet a cached glue file of
            // another build (the two are generated together).
            warp::reply::with_header(reply, "cache-control", "no-cache").into_response()
        }
        Err(e) => {
            // The path is for the log: the answer goes to a caller without the token.
            tracing::warn!(path = %path.display(), error = %e, "what-if module file unreadable");
            unavailable(
                "the what-if module is missing from --whatif-dir (built by scripts/build-whatif.sh)"
                    .into(),
            )
        }
    }
}
