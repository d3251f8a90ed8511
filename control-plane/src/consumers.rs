//! NATS subscriptions: decode worker messages and forward them to the router owner.
//!
//! One task reads heartbeats, load reports and KV events from a merged stream, so each
//! worker's KV batches reach the router in the order NATS delivered them. A message that
//! does not decode is counted (`switchyard_bad_messages_total{kind}`) and logged, never fatal.
//!
//! Resync requests: a worker seen for the first time, a restarted worker (new instance, cold
//! cache) and a gap in a worker's KV batch sequence all mean our view of its cache may be
//! wrong, so we publish a [`ResyncRequest`] on its resync subject. A per-worker-instance rate
//! limit keeps a burst of gapped batches (or a flapping worker) from turning into a burst of
//! full dumps.

use std::time::Duration;

use futures::StreamExt;

use switchyard_protocol::kv::{KvEventBatch, ResyncRequest};
use switchyard_protocol::registration::{
    unix_now_ms, RegistrationError, RegistrationSecret, MAX_CLOCK_SKEW_MS,
};
use switchyard_protocol::worker::{LoadReport, WorkerHeartbeat, WorkerId};
use switchyard_protocol::{subjects, PROTOCOL_VERSION};

use crate::metrics::Metrics;
use crate::router::core::Resync;
use crate::router::{KvEventError, WorkerChange};
use crate::service::ServiceHandle;

/// Shortest time between two resync requests to the same worker instance (the control
/// core's rate limit).
pub const RESYNC_MIN_INTERVAL: Duration =
    Duration::from_millis(switchyard_router::core::RESYNC_MIN_INTERVAL_MS);

/// Which message family a subscription carries (also the `kind` metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Heartbeat,
    Load,
    KvEvents,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Heartbeat => "heartbeat",
            Kind::Load => "load",
            Kind::KvEvents => "kv_events",
        }
    }
}

/// Which heartbeats may register (or refresh) a worker.
#[derive(Debug, Clone)]
pub enum Admission {
    /// Only heartbeats signed with this secret (`switchyard_protocol::registration`).
    Signed(RegistrationSecret),
    /// Any heartbeat (`--allow-unsigned-registrations`, development only).
    Unsigned,
    /// None: no worker joins over NATS.
    Closed,
}

impl Admission {
    /// Checks a heartbeat against the policy at `now_unix_ms` (this host's wall clock).
    ///
    /// # Errors
    /// The `workers_rejected` reason label.
    pub fn check(&self, hb: &WorkerHeartbeat, now_unix_ms: u64) -> Result<(), &'static str> {
        match self {
            Admission::Unsigned => Ok(()),
            Admission::Closed => Err("unsigned"),
            Admission::Signed(secret) => secret
                .verify(
                    &hb.worker,
                    hb.sent_at_ms,
                    hb.signature.as_deref(),
                    now_unix_ms,
                )
                .map_err(|e| match e {
                    RegistrationError::Unsigned => "unsigned",
                    RegistrationError::Stale { .. } => "stale",
                    _ => "bad_signature",
                }),
        }
    }
}

/// What the log says of a heartbeat the admission policy refused for `reason`.
fn admission_refusal(reason: &str) -> String {
    match reason {
        // Not a forgery: late, or from a host whose clock is off.
        "stale" => format!(
            "signed more than {} s away from this host's clock: the worker's and this host's \
             clocks differ, or the message came late (after this process stalled, the \
             heartbeats buffered meanwhile do; the worker's next one registers it)",
            MAX_CLOCK_SKEW_MS / 1000
        ),
        _ => "not a registration this control plane accepts (see --registration-secret-file)"
            .to_owned(),
    }
}

/// How many distinct refused worker ids get a warning each; beyond it refusals are only
/// counted, so a flood of spoofed ids cannot flood the log.
const MAX_WARNED_REFUSALS: usize = 1_024;

/// Subscribes (retrying until NATS accepts) and forwards messages until the router task
/// stops. Returns only then.
pub async fn run(
    client: async_nats::Client,
    service: ServiceHandle,
    metrics: Metrics,
    admission: Admission,
) {
    let mut subs = Vec::new();
    for (kind, subject) in [
        (Kind::Heartbeat, subjects::HEARTBEAT_ALL),
        (Kind::Heartbeat, subjects::HEARTBEAT),
        (Kind::Load, subjects::LOAD_ALL),
        (Kind::Load, subjects::LOAD),
        (Kind::KvEvents, subjects::KV_EVENTS_ALL),
    ] {
        let sub = subscribe_with_retry(&client, subject).await;
        subs.push(sub.map(move |m| (kind, m)).boxed());
    }
    tracing::info!("subscribed to worker heartbeats, load reports and KV events (active once NATS is connected)");
    let mut messages = futures::stream::select_all(subs);
    let mut consumer = Consumer {
        client,
        service,
        metrics,
        admission,
        warned: std::collections::HashSet::new(),
    };
    while let Some((kind, message)) = messages.next().await {
        if consumer
            .handle(kind, message.subject.as_str(), &message.payload)
            .await
            .is_err()
        {
            break;
        }
    }
    tracing::debug!("NATS consumer stopped");
}

pub(crate) async fn subscribe_with_retry(
    client: &async_nats::Client,
    subject: &'static str,
) -> async_nats::Subscriber {
    let mut delay = Duration::from_millis(100);
    loop {
        match client.subscribe(subject).await {
            Ok(sub) => return sub,
            Err(e) => {
                tracing::warn!(subject, error = %e, "NATS subscribe failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    }
}

struct Consumer {
    client: async_nats::Client,
    service: ServiceHandle,
    metrics: Metrics,
    admission: Admission,
    /// What was warned about already, with whom: a worker id with the reason its heartbeat
    /// was refused or its KV events rejected (a new reason for the same id is a new problem
    /// and warns again), a subject with the kind of malformed message on it.
    warned: std::collections::HashSet<(WorkerId, &'static str)>,
}

/// Whether a message on `subject` may speak for `worker`: on the shared subject `shared` (older
/// workers) anyone may; on a per-worker one (`shared.<id>`), only that worker.
fn sent_for(subject: &str, shared: &str, worker: &WorkerId) -> bool {
    match subject.strip_prefix(shared) {
        Some("") => true,
        Some(rest) => rest.strip_prefix('.') == Some(worker.0.as_str()),
        None => false,
    }
}

fn another_workers(worker: &WorkerId) -> String {
    format!("message names worker {worker} on another worker's subject")
}

/// Decodes a message, rejecting protocol versions this build does not read.
pub(crate) fn decode<T: serde::de::DeserializeOwned>(
    payload: &[u8],
    version: impl Fn(&T) -> u32,
) -> Result<T, String> {
    let msg: T = switchyard_protocol::from_json_object(payload).map_err(|e| e.to_string())?;
    match switchyard_protocol::unsupported_version(version(&msg)) {
        Some(why) => Err(why),
        None => Ok(msg),
    }
}

impl Consumer {
    /// Handles one message. `Err` only when the router task is gone (shutdown).
    async fn handle(
        &mut self,
        kind: Kind,
        subject: &str,
        payload: &[u8],
    ) -> Result<(), crate::service::ServiceStopped> {
        match kind {
            Kind::Heartbeat => match decode::<WorkerHeartbeat>(payload, |m| m.v) {
                Ok(hb) if !sent_for(subject, subjects::HEARTBEAT, &hb.worker.worker_id) => {
                    self.bad(kind, subject, &another_workers(&hb.worker.worker_id));
                }
                Ok(hb) if self.refuse(&hb) => {}
                Ok(hb) => {
                    let worker = hb.worker.worker_id.clone();
                    let outcome = self.service.heartbeat(hb).await?;
                    match outcome.change {
                        WorkerChange::New => tracing::info!(worker = %worker, "worker registered"),
                        WorkerChange::Restarted => {
                            tracing::info!(worker = %worker, "worker restarted (new instance)")
                        }
                        WorkerChange::Refreshed => {}
                        WorkerChange::Rejected => {
                            self.metrics.worker_rejected("invalid");
                            tracing::warn!(worker = %worker, "heartbeat refused: invalid block size or too many workers");
                        }
                        WorkerChange::Declared => self.refused(
                            &worker,
                            "declared",
                            "a worker of this id is declared in the pool file and keeps it; give the self-registering worker another id",
                        ),
                        WorkerChange::AddressInUse => self.refused(
                            &worker,
                            "address_in_use",
                            "another live worker is registered at this address (GET /v1/workers) and keeps it until it is withdrawn or expires; one address is one engine",
                        ),
                        WorkerChange::EngineMismatch => self.refused(
                            &worker,
                            "engine_mismatch",
                            "a live worker of its model runs another engine (GET /v1/workers); a model's workers run one engine: give it its own model name or the model's engine",
                        ),
                        WorkerChange::IdInUse => self.refused(
                            &worker,
                            "id_in_use",
                            "a live worker of this id runs as another process at another address and keeps the id until it expires; give each process its own id",
                        ),
                    }
                    self.carry_out(outcome.resync).await;
                }
                Err(e) => self.bad(kind, subject, &e),
            },
            Kind::Load => match decode::<LoadReport>(payload, |m| m.v) {
                Ok(report) if !sent_for(subject, subjects::LOAD, &report.worker_id) => {
                    self.bad(kind, subject, &another_workers(&report.worker_id));
                }
                Ok(report) => match report.check() {
                    Ok(()) => self.service.load(report).await?,
                    Err(e) => self.bad(kind, subject, &e.to_string()),
                },
                Err(e) => self.bad(kind, subject, &e),
            },
            Kind::KvEvents => match decode::<KvEventBatch>(payload, |m| m.v) {
                Ok(batch) if subject != subjects::kv_events(&batch.worker_id) => {
                    self.bad(kind, subject, &another_workers(&batch.worker_id));
                }
                Ok(batch) => {
                    let worker = batch.worker_id.clone();
                    let outcome = self.service.kv_batch(batch).await?;
                    match &outcome.result {
                        // A block size other than registered is a misconfiguration that lasts:
                        // every batch of that worker is lost to routing. Said once per worker.
                        Err(e @ KvEventError::BlockSizeMismatch { .. })
                            if self.first_warning(&worker, "kv_block_size_mismatch") =>
                        {
                            tracing::warn!(worker = %worker, "KV events rejected: {e}; fix the worker's --block-size or the engine's");
                        }
                        // Unknown workers (a batch before the heartbeat) and stale batches
                        // (duplicates) are ordinary, and counted.
                        Err(e) => {
                            tracing::debug!(worker = %worker, error = %e, "KV batch rejected")
                        }
                        Ok(_) => {}
                    }
                    self.carry_out(outcome.resync).await;
                }
                Err(e) => self.bad(kind, subject, &e),
            },
        }
        Ok(())
    }

    /// Whether `hb` is refused: by the admission policy, or as a worker the pools cannot hold
    /// (an id that is not one subject token, an address Envoy cannot take, an interval above
    /// the bound). Counted, and warned once per worker id and reason.
    fn refuse(&mut self, hb: &WorkerHeartbeat) -> bool {
        let (reason, why) = match self.admission.check(hb, unix_now_ms()) {
            Err(reason) => (reason, admission_refusal(reason)),
            Ok(()) => match hb.check() {
                Ok(()) => return false,
                Err(invalid) => ("invalid", invalid.to_string()),
            },
        };
        let why = format!("{why} (address {})", hb.worker.address);
        self.refused(&hb.worker.worker_id, reason, &why);
        true
    }

    /// Counts a refused heartbeat of `id` under `reason`, and warns `why` once per worker id
    /// and reason.
    fn refused(&mut self, id: &WorkerId, reason: &'static str, why: &str) {
        self.metrics.worker_rejected(reason);
        if self.first_warning(id, reason) {
            tracing::warn!(worker = %id, reason, "heartbeat refused: {why}");
        } else {
            tracing::debug!(worker = %id, reason, "heartbeat refused");
        }
    }

    /// Counts a malformed message; warns once per subject and kind (a worker sending a wrong
    /// format sends it at its report rate), then at debug.
    fn bad(&mut self, kind: Kind, subject: &str, error: &str) {
        self.metrics.bad_message(kind.as_str());
        if self.first_warning(&WorkerId(subject.to_string()), kind.as_str()) {
            tracing::warn!(
                subject,
                kind = kind.as_str(),
                error,
                "dropped malformed NATS message (said once per subject and kind; counted in bad_messages_total)"
            );
        } else {
            tracing::debug!(
                subject,
                kind = kind.as_str(),
                error,
                "dropped malformed NATS message"
            );
        }
    }

    /// Whether this is the first warning about `key` for `what` (bounded: past
    /// [`MAX_WARNED_REFUSALS`] keys, nothing is warned again).
    fn first_warning(&mut self, key: &WorkerId, what: &'static str) -> bool {
        self.warned.len() < MAX_WARNED_REFUSALS && self.warned.insert((key.clone(), what))
    }

    /// Publishes the resync the control core decided on, if any.
    async fn carry_out(&mut self, resync: Option<Resync>) {
        if let Some(resync) = resync {
            carry_out_resync(&self.client, &self.metrics, resync).await;
        }
    }
}

/// Publishes a resync request the control core decided on (or counts a suppressed one).
pub(crate) async fn carry_out_resync(
    client: &async_nats::Client,
    metrics: &Metrics,
    resync: Resync,
) {
    let (worker, reason) = match resync {
        Resync::Suppressed => {
            metrics.resync_suppressed.inc();
            return;
        }
        Resync::Send { worker, reason } => (worker, reason),
    };
    let request = ResyncRequest {
        v: PROTOCOL_VERSION,
        worker_id: worker.clone(),
        reason: reason.as_str().to_string(),
    };
    let payload = match serde_json::to_vec(&request) {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(error = %e, "cannot encode a resync request");
            return;
        }
    };
    match client
        .publish(subjects::kv_resync(&worker), payload.into())
        .await
    {
        Ok(()) => {
            metrics.resync_sent(reason.as_str());
            tracing::info!(worker = %worker, reason = reason.as_str(), "asked worker for a KV resync");
        }
        Err(e) => tracing::warn!(worker = %worker, error = %e, "cannot publish resync request"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newer_protocol_versions_are_rejected() {
        let err = decode::<LoadReport>(
            br#"{"v":99,"worker_id":"d","running":0,"waiting":0,"kv_used_blocks":0,"kv_total_blocks":0,"queued_prefill_tokens":0}"#,
            |m| m.v,
        )
        .unwrap_err();
        assert!(err.contains("99"), "{err}");
        assert!(decode::<LoadReport>(b"{", |m| m.v).is_err());
    }

    #[test]
    fn a_per_worker_subject_speaks_for_its_worker_only() {
        let d0 = WorkerId("decode-0".into());
        let shared = subjects::LOAD;
        assert!(sent_for(&subjects::load(&d0), shared, &d0));
        assert!(
            sent_for(shared, shared, &d0),
            "the shared subject of older workers"
        );
        assert!(!sent_for(
            &subjects::load(&WorkerId("decode-1".into())),
            shared,
            &d0
        ));
        assert!(!sent_for("switchyard.workers.load.decode-0.x", shared, &d0));
        assert!(!sent_for("switchyard.workers.loadx", shared, &d0));
        assert!(sent_for(
            &subjects::heartbeat(&d0),
            subjects::HEARTBEAT,
            &d0
        ));
    }

    /// A late heartbeat (one buffered while this process stalled) does not send the
    /// operator to the secret file; a forged or unsigned one does.
    #[test]
    fn a_stale_heartbeat_is_logged_as_late_not_as_a_secret_problem() {
        let stale = admission_refusal("stale");
        assert!(
            stale.contains("came late") && stale.contains("60 s"),
            "{stale}"
        );
        assert!(!stale.contains("--registration-secret-file"), "{stale}");
        for reason in ["unsigned", "bad_signature"] {
            assert!(admission_refusal(reason).contains("--registration-secret-file"));
        }
    }
}
