//! The disaggregated path, for each engine's [`Handoff`].
//!
//! **Sequential handoffs** (vLLM, TensorRT-LLM): the prefill leg (`dispatch_http_call` to
//! the prefill cluster, with the prefill worker named in `x-gateway-destination-endpoint` for
//! the cluster's `override_host` policy), bounded retries of 502/503/504, then the decode
//! leg's body from the answer. Any failure falls back to local prefill on the decode worker:
//! the client's body goes on unchanged (no handoff fields), so the request is served either
//! way.
//!
//! **Concurrent handoffs** (SGLang): both legs leave at once, tied by a bootstrap room; the
//! decode leg is the client's request, streaming to the client. A prefill leg that cannot
//! even be dispatched falls back as above (the decode leg has not left yet). Once the decode
//! leg is out, nothing can be retried (its body names this prefill worker's room) and the
//! decode worker cannot prefill instead, so a failed prefill leg ends the request with a 502
//! from the gateway, unless the decode worker has answered already (docs/engines.md).

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

use log::{debug, warn};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use switchyard_protocol::handoff::{
    address_host, disagg_request_id as draw_disagg_request_id, BootstrapRoom, LegOrder,
};
use switchyard_protocol::route::{RouteMode, DESTINATION_HEADER, REQUEST_ID_HEADER};

use super::{ConcurrentPrefill, Phase, PrefillLeg, SwitchyardRequest};
use crate::body::{self, DecodeBody, RequestDoc};
use crate::headers::StreamHeaders;
use crate::outcome::{FallbackReason, Served};
use crate::prefill::{classify_prefill_answer, prefill_leg_cluster, PrefillFailure, PrefillStep};
use crate::request::prefill_leg_headers;
use crate::shared::increment;
use crate::verdict::PrefillTarget;

impl SwitchyardRequest {
    /// Starts the disaggregated path with `prefill` for decode worker `decode`; on any
    /// failure to start, the decode worker prefills locally.
    pub(super) fn start_prefill_leg(
        &mut self,
        doc: Option<RequestDoc>,
        decode: String,
        prefill: PrefillTarget,
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
                return self.fall_back(decode, prefill.address, "the body does not parse");
            }
        };
        // 64 random bits from the host, as for SGLang's room below.
        let disagg_request_id = prefill
            .disagg_request_id
            .then(|| draw_disagg_request_id(RandomState::new().hash_one(&self.request_id)));
        let leg = PrefillLeg {
            doc,
            decode,
            prefill: prefill.address,
            handoff: prefill.handoff,
            disagg_request_id,
            retries: 0,
            started_ms: self.now_ms(),
        };
        match (prefill.handoff.order(), prefill.bootstrap_port) {
            (LegOrder::Concurrent, Some(port)) => self.start_concurrent_legs(leg, port),
            // `PrefillTarget` never lets this through; the legs could not meet without it.
            (LegOrder::Concurrent, None) => {
                self.fall_back(leg.decode, leg.prefill, "no bootstrap port")
            }
            (LegOrder::Sequential, _) => {
                let target = leg.prefill.clone();
                self.dispatch_prefill(leg, Some(&target), None);
            }
        }
    }

    /// Both legs of a concurrent handoff: the prefill leg dispatched, then the decode leg
    /// (the client's request with the same room) handed to Envoy.
    fn start_concurrent_legs(&mut self, leg: PrefillLeg, bootstrap_port: u16) {
        // 63 random bits per request: std's RandomState draws its keys from the host's
        // random source (WASI `random_get`, which Envoy implements).
        let bits = RandomState::new().hash_one(&self.request_id);
        let room = BootstrapRoom {
            host: address_host(&leg.prefill),
            port: bootstrap_port,
            room: BootstrapRoom::room_from_bits(bits),
        };
        let decode_body = match leg.doc.concurrent_decode_body(leg.handoff, &room) {
            Ok(Some(body)) => body,
            _ => return self.fall_back(leg.decode, leg.prefill, "the decode body"),
        };
        let target = leg.prefill.clone();
        let Some(token) = self.dispatch_prefill_call(&leg, Some(&target), Some(&room)) else {
            return self.fall_back(leg.decode, leg.prefill, "the dispatch was refused");
        };
        if !self.replace_body(&decode_body) {
            // The prefill worker will wait for a decode worker that never comes, until its
            // bootstrap timeout; the client is still served, by local prefill.
            return self.fall_back(leg.decode, leg.prefill, "the body could not be rewritten");
        }
        increment(self.shared.stats.prefill_attempts_total, 1);
        self.concurrent_prefill = Some(ConcurrentPrefill {
            token,
            started_ms: leg.started_ms,
        });
        let served = Served::Routed {
            mode: RouteMode::Disagg,
            destination: leg.decode,
        };
        self.forward(served, Some(leg.prefill), None);
        self.resume_http_request();
    }

    /// The prefill leg of a concurrent handoff answered (or Envoy did for it). A failure
    /// before the decode worker answered ends the request with a 502: see the module docs.
    pub(super) fn on_concurrent_prefill_answer(
        &mut self,
        status: Option<&str>,
        prefill: ConcurrentPrefill,
    ) {
        self.record_prefill_latency(prefill.started_ms);
        // No retries: the decode leg already names this prefill worker's room.
        let failure = match classify_prefill_answer(status, 0, 0) {
            PrefillStep::Answered => {
                increment(self.shared.stats.prefill_handoffs_total, 1);
                return;
            }
            // Never with a bound of 0 retries.
            PrefillStep::Retry => PrefillFailure::NoStatus,
            PrefillStep::Failed(failure) => failure,
        };
        increment(self.shared.stats.prefill_failures_total, 1);
        let Phase::Done {
            served: Served::Routed { destination, .. },
            ..
        } = &self.phase
        else {
            return;
        };
        if self.response.status.is_some() {
            debug!(
                "#{} {} prefill leg failed ({failure:?}) after the decode worker answered",
                self.context_id, self.request_id
            );
            return;
        }
        warn!(
            "#{} {} prefill leg failed ({failure:?}) while the decode leg waits for its KV: 502",
            self.context_id, self.request_id
        );
        increment(self.shared.stats.prefill_lost_total, 1);
        let served = Served::PrefillLost {
            destination: destination.clone(),
        };
        let route = served.route_header_value();
        if let Phase::Done { served: s, .. } = &mut self.phase {
            *s = served;
        }
        let body = body::prefill_lost_error(&failure.to_string());
        if let Err(status) =
            hostcalls::send_http_response(502, self.local_reply_headers(&route), Some(&body))
        {
            warn!("#{} cannot send the 502: {status:?}", self.context_id);
        }
    }

    /// One prefill attempt of a sequential handoff. `target` names the prefill worker; retries
    /// pass `None` so Envoy's fallback load balancer may pick a healthier one, within the
    /// request's model when the gateway has a cluster per model ([`prefill_leg_cluster`]).
    fn dispatch_prefill(
        &mut self,
        leg: PrefillLeg,
        target: Option<&str>,
        room: Option<&BootstrapRoom<'_>>,
    ) {
        match self.dispatch_prefill_call(&leg, target, room) {
            Some(token) => {
                increment(self.shared.stats.prefill_attempts_total, 1);
                self.phase = Phase::Prefilling { token, leg };
            }
            None => self.fall_back(leg.decode, leg.prefill, "the dispatch was refused"),
        }
    }

    /// Dispatches the prefill leg's call; `None` when its body cannot be built or Envoy
    /// refuses the call (a cluster it does not define, e.g. a model added to the pool file
    /// that the bootstrap has no prefill cluster for).
    fn dispatch_prefill_call(
        &self,
        leg: &PrefillLeg,
        target: Option<&str>,
        room: Option<&BootstrapRoom<'_>>,
    ) -> Option<u32> {
        let body = match leg
            .doc
            .prefill_body(leg.handoff, room, leg.disagg_request_id)
        {
            Ok(body) => body,
            Err(e) => {
                warn!("#{} {} prefill body: {e}", self.context_id, self.request_id);
                return None;
            }
        };
        let config = &self.shared.config;
        let authority = if self.authority.is_empty() {
            config.prefill_cluster.as_str()
        } else {
            self.authority.as_str()
        };
        // The client's credentials go on the leg as on the decode leg: a prefill pool behind
        // the same authentication (vLLM's `--api-key`) refused every leg without them.
        let client = self.request_headers();
        let mut headers = vec![
            (":method", "POST"),
            (":path", self.path.as_str()),
            (":authority", authority),
            ("content-type", "application/json"),
            (REQUEST_ID_HEADER, self.request_id.as_str()),
        ];
        headers.extend(prefill_leg_headers(&client, REQUEST_ID_HEADER));
        if let Some(target) = target {
            headers.push((DESTINATION_HEADER, target));
        }
        // The model's own prefill cluster, which holds the named worker: should it be gone,
        // Envoy's fallback picks another of the model's prefill workers, never another
        // model's (and a retry, naming none, stays in the model too).
        let cluster = prefill_leg_cluster(
            &config.prefill_cluster,
            config.prefill_model_clusters,
            leg.doc.model(),
        )
        .into_owned();
        match self.dispatch_http_call(
            &cluster,
            headers,
            Some(&body),
            vec![],
            config.prefill_timeout(),
        ) {
            Ok(token) => Some(token),
            Err(status) => {
                // Every disaggregated request falls back to local prefill while this lasts:
                // worth a line each, saying what to check.
                warn!(
                    "#{} {} prefill dispatch to cluster {cluster:?} refused: {status:?} (is it one of Envoy's clusters? prefill_cluster names it, with `__<model>` per model under prefill_model_clusters); prefilling on the decode worker",
                    self.context_id, self.request_id
                );
                None
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
                self.dispatch_prefill(leg, None, None);
            }
            PrefillStep::Failed(failure) => {
                self.record_prefill_latency(leg.started_ms);
                let reason = failure.fallback_reason();
                self.fall_back_for(reason, leg.decode, leg.prefill, &format!("{failure:?}"));
            }
            PrefillStep::Answered => {
                self.record_prefill_latency(leg.started_ms);
                let served = Served::Routed {
                    mode: RouteMode::Disagg,
                    destination: leg.decode.clone(),
                };
                match leg.doc.decode_leg(leg.handoff, body, leg.disagg_request_id) {
                    Ok(Some(DecodeBody { body, hold })) if self.replace_body(&body) => {
                        increment(self.shared.stats.prefill_handoffs_total, 1);
                        self.forward(served, Some(leg.prefill), hold);
                    }
                    Ok(None) => {
                        increment(self.shared.stats.prefill_no_handoff_total, 1);
                        self.forward(served, Some(leg.prefill), None);
                    }
                    // An answer the engine does not give (a proxy's HTML page, a truncated
                    // body) is a failed prefill, not vLLM's "nothing to hand over".
                    Err(why) => return self.fall_back(leg.decode, leg.prefill, &why),
                    Ok(Some(_)) => {
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

    fn record_prefill_latency(&self, started_ms: u64) {
        let elapsed = self.now_ms().saturating_sub(started_ms);
        if let Err(e) = hostcalls::record_metric(self.shared.stats.prefill_latency_ms, elapsed) {
            debug!("#{} record_metric failed: {e:?}", self.context_id);
        }
    }

    /// Serves the request with local prefill on the decode worker, body unchanged.
    fn fall_back(&mut self, decode: String, prefill: String, why: &str) {
        self.fall_back_for(FallbackReason::PrefillFailed, decode, prefill, why);
    }

    fn fall_back_for(
        &mut self,
        reason: FallbackReason,
        decode: String,
        prefill: String,
        why: &str,
    ) {
        if reason == FallbackReason::PrefillRefused {
            // Usually the client's request (the decode worker answers it the same 400), so a
            // line each would let clients flood the log; every one is counted
            // (`fallback.prefill_refused`), and a gateway whose engine settings do not match
            // the servers' shows as that counter following `routed.disagg`.
            debug!(
                "#{} {} prefill worker {prefill} refused the prefill leg ({why}): the request itself, or engine settings that do not match the servers'; local prefill",
                self.context_id, self.request_id
            );
        } else {
            increment(self.shared.stats.prefill_failures_total, 1);
            debug!(
                "#{} {} prefill leg on {prefill} failed: {why}",
                self.context_id, self.request_id
            );
        }
        let served = Served::Fallback {
            reason,
            destination: decode,
        };
        self.forward(served, Some(prefill), None);
        self.resume_http_request();
    }
}
