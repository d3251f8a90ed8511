//! The disaggregated path: the prefill leg (`dispatch_http_call` to the prefill cluster, with
//! the prefill worker named in `x-gateway-destination-endpoint` for the cluster's
//! `override_host` policy), bounded retries of 502/503/504, and the decode leg's body, both
//! built by the engine's [`Handoff`].
//!
//! Any failure falls back to local prefill on the decode worker: the client's body goes on
//! unchanged (no handoff fields), so the request is served either way.

use log::{debug, warn};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use switchyard_protocol::handoff::Handoff;
use switchyard_protocol::route::{RouteMode, DESTINATION_HEADER, REQUEST_ID_HEADER};

use super::{Phase, PrefillLeg, SwitchyardRequest};
use crate::body::{DecodeBody, RequestDoc};
use crate::outcome::{FallbackReason, Served};
use crate::prefill::{classify_prefill_answer, retry_cluster, PrefillStep};
use crate::shared::increment;

/// The handoff protocol of the prefill pool (vLLM's NIXL connector; other engines' come with
/// their pools).
const HANDOFF: Handoff = Handoff::VllmNixl;

impl SwitchyardRequest {
    /// Starts the prefill leg on `prefill` (`host:port`) for decode worker `decode`; on any
    /// failure to start, the decode worker prefills locally.
    pub(super) fn start_prefill_leg(
        &mut self,
        doc: Option<RequestDoc>,
        decode: String,
        prefill: String,
    ) {
        let doc = match doc {
            Some(doc) => Ok(doc),
            None => {
                let body = self
                    .get_http_request_body(0, self.body_len)
                    .unwrap_or_default();
                RequestDoc::parse(&body)
            }
        };
        let doc = match doc {
            Ok(doc) => doc,
            Err(e) => {
                warn!("#{} {} prefill leg: {e}", self.context_id, self.request_id);
                return self.fall_back(decode, prefill, "the body does not parse");
            }
        };
        let leg = PrefillLeg {
            doc,
            decode,
            prefill,
            retries: 0,
            started_ms: self.now_ms(),
        };
        let target = leg.prefill.clone();
        self.dispatch_prefill(leg, Some(&target));
    }

    /// One prefill attempt. `target` names the prefill worker (on the shared prefill cluster);
    /// retries pass `None` so Envoy's fallback load balancer may pick a healthier one, within
    /// the request's model when the gateway has a cluster per model ([`retry_cluster`]).
    fn dispatch_prefill(&mut self, leg: PrefillLeg, target: Option<&str>) {
        let body = match leg.doc.prefill_body(HANDOFF) {
            Ok(body) => body,
            Err(e) => {
                warn!("#{} {} prefill body: {e}", self.context_id, self.request_id);
                return self.fall_back(leg.decode, leg.prefill, "the prefill body");
            }
        };
        let config = &self.shared.config;
        let authority = if self.authority.is_empty() {
            config.prefill_cluster.as_str()
        } else {
            self.authority.as_str()
        };
        let mut headers = vec![
            (":method", "POST"),
            (":path", self.path.as_str()),
            (":authority", authority),
            ("content-type", "application/json"),
            (REQUEST_ID_HEADER, self.request_id.as_str()),
        ];
        let cluster = match target {
            Some(target) => {
                headers.push((DESTINATION_HEADER, target));
                config.prefill_cluster.clone()
            }
            None => retry_cluster(
                &config.prefill_cluster,
                config.prefill_model_clusters,
                leg.doc.model(),
            )
            .into_owned(),
        };
        match self.dispatch_http_call(
            &cluster,
            headers,
            Some(&body),
            vec![],
            config.prefill_timeout(),
        ) {
            Ok(token) => {
                increment(self.shared.stats.prefill_attempts_total, 1);
                self.phase = Phase::Prefilling { token, leg };
            }
            Err(status) => {
                // A cluster Envoy does not define is refused here (e.g. a model added to the
                // pool file that the bootstrap has no prefill cluster for).
                warn!(
                    "#{} {} prefill dispatch to {cluster} refused: {status:?}",
                    self.context_id, self.request_id
                );
                self.fall_back(leg.decode, leg.prefill, "the dispatch was refused");
            }
        }
    }

    /// The prefill worker answered (or Envoy did for it).
    pub(super) fn on_prefill_answer(
        &mut self,
        status: Option<&str>,
        body: &[u8],
        mut leg: PrefillLeg,
    ) {
        let max_retries = self.shared.config.prefill_retries;
        match classify_prefill_answer(status, leg.retries, max_retries) {
            PrefillStep::Retry => {
                leg.retries += 1;
                increment(self.shared.stats.prefill_retries_total, 1);
                debug!(
                    "#{} {} prefill answered {status:?}; retry {}",
                    self.context_id, self.request_id, leg.retries
                );
                self.dispatch_prefill(leg, None);
            }
            PrefillStep::Failed(failure) => {
                self.record_prefill_latency(&leg);
                self.fall_back(leg.decode, leg.prefill, &format!("{failure:?}"));
            }
            PrefillStep::Answered => {
                self.record_prefill_latency(&leg);
                let served = Served::Routed {
                    mode: RouteMode::Disagg,
                    destination: leg.decode.clone(),
                };
                match leg.doc.decode_leg(HANDOFF, body) {
                    Ok(Some(DecodeBody { body, hold })) if self.replace_body(&body) => {
                        increment(self.shared.stats.prefill_handoffs_total, 1);
                        self.forward(served, Some(leg.prefill), hold);
                    }
                    Ok(None) => {
                        increment(self.shared.stats.prefill_no_handoff_total, 1);
                        self.forward(served, Some(leg.prefill), None);
                    }
                    _ => {
                        return self.fall_back(
                            leg.decode,
                            leg.prefill,
                            "the decode body could not be rewritten",
                        )
                    }
                }
                self.resume_http_request();
            }
        }
    }

    fn record_prefill_latency(&self, leg: &PrefillLeg) {
        let elapsed = self.now_ms().saturating_sub(leg.started_ms);
        if let Err(e) = hostcalls::record_metric(self.shared.stats.prefill_latency_ms, elapsed) {
            debug!("#{} record_metric failed: {e:?}", self.context_id);
        }
    }

    /// Serves the request with local prefill on the decode worker, body unchanged.
    fn fall_back(&mut self, decode: String, prefill: String, why: &str) {
        increment(self.shared.stats.prefill_failures_total, 1);
        debug!(
            "#{} {} prefill leg failed: {why}",
            self.context_id, self.request_id
        );
        let served = Served::Fallback {
            reason: FallbackReason::PrefillFailed,
            destination: decode,
        };
        self.forward(served, Some(prefill), None);
        self.resume_http_request();
    }
}
