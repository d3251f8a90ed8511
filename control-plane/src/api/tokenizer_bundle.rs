//! `GET /v1/tokenizer`: a model's tokenizer bundle, for a filter that tokenizes prompts
//! itself (filter config `"tokenize": "filter"`). The model is named in
//! `x-switchyard-model` (absent: the model a body without `model` resolves to) and resolved
//! exactly as a route request's `model`, so the filter tokenizes with the tokenizer the
//! control plane would have used; the block size is the one its live workers registered.

use warp::http::{HeaderMap, StatusCode};
use warp::reply::Response;
use warp::Reply;

use switchyard_protocol::route::MODEL_HEADER;
use switchyard_protocol::tokenize::{TokenizerBundle, TokenizerFiles};
use switchyard_protocol::PROTOCOL_VERSION;

use super::route::model_not_found;
use super::{error_reply, ApiState};
use crate::models::ModelRefusal;

/// The handler.
pub async fn handle(headers: HeaderMap, state: ApiState) -> Response {
    let mut named = serde_json::Map::new();
    if let Some(value) = headers.get(MODEL_HEADER) {
        let Ok(model) = value.to_str() else {
            state.metrics.bad_request("unknown_model");
            return error_reply(
                StatusCode::BAD_REQUEST,
                "unknown_model",
                format!("{MODEL_HEADER} is not ASCII"),
            );
        };
        named.insert("model".into(), model.into());
    }
    let model = match state.models.resolve(&named) {
        Ok(model) => model,
        Err(refusal) => {
            state.metrics.bad_request("unknown_model");
            return match refusal {
                ModelRefusal::Unknown(name) => warp::reply::with_status(
                    warp::reply::json(&model_not_found(&name)),
                    StatusCode::NOT_FOUND,
                )
                .into_response(),
                ModelRefusal::NotAString => error_reply(
                    StatusCode::BAD_REQUEST,
                    "unknown_model",
                    format!("{MODEL_HEADER} must name a model"),
                ),
                ModelRefusal::Missing => error_reply(
                    StatusCode::BAD_REQUEST,
                    "unknown_model",
                    format!("{MODEL_HEADER} required: this gateway serves several models"),
                ),
            };
        }
    };
    // The block size the router will match this model's prompts at: its live decode-capable
    // workers' (they registered it), else the pool file's or the default.
    let block_size = match state.service.workers().await {
        Ok(workers) => workers
            .iter()
            .map(|w| &w.view.info)
            .filter(|info| info.role.serves_decode())
            .find(|info| model.name.as_ref().is_none_or(|name| &info.model == name))
            .map_or(model.block_size, |info| info.block_size),
        Err(_) => model.block_size,
    };
    // Reads ~10 MB of files: off the async threads. Read afresh each time: a filter VM asks
    // once, so there is nothing to gain from keeping the texts in memory here.
    let dir = model.dir.clone();
    let read = tokio::task::spawn_blocking(move || TokenizerFiles::read_dir(&dir)).await;
    match read {
        Ok(Ok(files)) => warp::reply::json(&TokenizerBundle {
            v: PROTOCOL_VERSION,
            model: model.name.clone(),
            block_size,
            files,
        })
        .into_response(),
        Ok(Err(e)) => unreadable(&state, e.to_string()),
        Err(join) => unreadable(&state, format!("reading the model folder failed: {join}")),
    }
}

/// The model's folder could not be read: a 500, counted.
fn unreadable(state: &ApiState, message: String) -> Response {
    state.metrics.bad_request("tokenizer");
    error_reply(StatusCode::INTERNAL_SERVER_ERROR, "tokenizer", message)
}
