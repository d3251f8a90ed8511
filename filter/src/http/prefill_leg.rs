//! The disaggregated path: the prefill leg (`dispatch_http_call` to the prefill cluster, with
//! the prefill worker named in `x-gateway-destination-endpoint` for the cluster's
//! `override_host` policy), bounded retries of 502/503/504, and the decode leg's body.
//!
//! Any failure falls back to local prefill on the decode worker: the client's body goes on
//! unchanged (no `kv_transfer_params`), so the request is served either way.

use log::{debug, warn};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use switchyard_protocol::route::{RouteMode, DESTINATION_HEADER, REQUEST_ID_HEADER};

use super::{Pending, SwitchyardRequest};
use crate::body::RequestDoc;
use crate::outcome::{FallbackReason, Served};
use crate::prefill::{classify_prefill_answer, PrefillStep};
use crate::root::increment;
use crate::verdict::RouteOutcome;

impl SwitchyardRequest {
    /// Starts the prefill leg on `prefill` (`host:port`). False if it cannot even start (the
    /// caller falls back to local prefill).
    pub(super) fn start_prefill_leg(&mut self, prefill: &str) -> bool {
        if self.doc.is_none() {
            let body = self
                .get_http_request_body(0, self.body_len)
                .unwrap_or_default();
            match RequestDoc::parse(&body) {
                Ok(doc) => self.doc = Some(doc),
                Err(e) => {
                    warn!("#{} {} prefill leg: {e}", self.context_id, self.request_id);
                    return false;
                }
            }
        }
        self.prefill_started_ms = self.now().as_millis() as u64;
        self.dispatch_prefill(Some(prefill))
    }

    /// One prefill attempt. `target` names the prefill worker; retries pass `None` so Envoy's
    /// fallback load balancer may pick a healthier one.
    fn dispatch_prefill(&mut self, target: Option<&str>) -> bool {
        let Some(doc) = &self.doc else {
            return false;
        };
        let body = match doc.prefill_body() {
            Ok(body) => body,
            Err(e) => {
                warn!("#{} {} prefill body: {e}", self.context_id, self.request_id);
                return false;
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
        if let Some(target) = target {
            headers.push((DESTINATION_HEADER, target));
        }
        match self.dispatch_http_call(
            &config.prefill_cluster,
            headers,
            Some(&body),
            vec![],
            config.prefill_timeout(),
        ) {
            Ok(token) => {
                increment(self.shared.stats.prefill_attempts_total, 1);
                self.pending = Some(Pending::Prefill(token));
                true
            }
            Err(status) => {
                warn!(
                    "#{} {} prefill dispatch refused: {status:?}",
                    self.context_id, self.request_id
                );
                false
            }
        }
    }

    fn decode_destination(&self) -> String {
        match &self.verdict {
            Some(RouteOutcome::Routed { destination, .. }) => destination.clone(),
            _ => String::new(),
        }
    }

    /// The prefill worker answered (or Envoy did for it).
    pub(super) fn on_prefill_answer(&mut self, status: Option<&str>, body: &[u8]) {
        let config = &self.shared.config;
        let step = classify_prefill_answer(
            status,
            body,
            self.prefill_retries_done,
            config.prefill_retries,
        );
        if step == PrefillStep::Retry {
            self.prefill_retries_done += 1;
            increment(self.shared.stats.prefill_retries_total, 1);
            debug!(
                "#{} {} prefill answered {status:?}; retry {}",
                self.context_id, self.request_id, self.prefill_retries_done
            );
            if self.dispatch_prefill(None) {
                return;
            }
            self.fall_back(format!("retry could not be dispatched after {status:?}"));
            return;
        }
        let elapsed = (self.now().as_millis() as u64).saturating_sub(self.prefill_started_ms);
        if let Err(e) = hostcalls::record_metric(self.shared.stats.prefill_latency_ms, elapsed) {
            debug!("#{} record_metric failed: {e:?}", self.context_id);
        }
        let destination = self.decode_destination();
        match step {
            PrefillStep::Handoff(params) => {
                let decode_body = self.doc.as_ref().map(|doc| doc.decode_body(&params));
                match decode_body {
                    Some(Ok(decode_body)) if self.replace_body(&decode_body) => {
                        increment(self.shared.stats.prefill_handoffs_total, 1);
                        self.finish(
                            Served::Routed {
                                mode: RouteMode::Disagg,
                                destination,
                            },
                            false,
                        );
                    }
                    _ => {
                        self.fall_back("the decode body could not be rewritten".to_string());
                        return;
                    }
                }
            }
            PrefillStep::NoHandoff => {
                increment(self.shared.stats.prefill_no_handoff_total, 1);
                self.finish(
                    Served::Routed {
                        mode: RouteMode::Disagg,
                        destination,
                    },
                    false,
                );
            }
            PrefillStep::Failed(failure) => {
                self.fall_back(format!("{failure:?}"));
                return;
            }
            PrefillStep::Retry => {}
        }
        self.resume_http_request();
    }

    /// Serves the request with local prefill on the decode worker, body unchanged.
    fn fall_back(&mut self, why: String) {
        increment(self.shared.stats.prefill_failures_total, 1);
        debug!(
            "#{} {} prefill leg failed: {why}",
            self.context_id, self.request_id
        );
        let destination = self.decode_destination();
        self.finish(
            Served::Fallback {
                reason: FallbackReason::PrefillFailed,
                destination,
            },
            false,
        );
        self.resume_http_request();
    }
}
