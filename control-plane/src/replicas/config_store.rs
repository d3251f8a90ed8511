//! The router config all replicas share: one key ([`CONFIG_KEY`]) in a NATS KV bucket
//! ([`CONFIG_BUCKET`], JetStream), the source of truth, its revision the config's version.
//!
//! A replica starting with no shared config yet writes its own start-up config there (the
//! first replica wins; the others adopt it). [`follow`] applies every revision it watches;
//! `PUT /v1/config` on any replica patches the current revision with a compare-and-set
//! ([`ConfigStore::write`]), so two concurrent `PUT`s cannot lose one another: the loser
//! retries on the winner's config.

use std::time::Duration;

use async_nats::jetstream::kv::{self, CreateErrorKind, Operation, UpdateErrorKind};
use futures::StreamExt;

use switchyard_protocol::replica::{CONFIG_BUCKET, CONFIG_KEY};

use crate::config::RouterConfig;
use crate::config_version::{IfMatch, PatchRefusal};
use crate::metrics::Metrics;
use crate::service::ServiceHandle;

/// Writes retried on a concurrent change before giving up.
const WRITE_ATTEMPTS: usize = 5;
/// How long a `PUT /v1/config` waits for the store before answering 503 (JetStream's own
/// request timeouts add up to 20 s, past many clients' patience).
const PATCH_TIMEOUT: Duration = Duration::from_secs(5);
/// How often [`follow`] checks the store's current revision against what it watched: a
/// store whose data was lost restarts its revisions, and its watch may stay silent.
const STORE_CHECK_INTERVAL: Duration = Duration::from_secs(5);

/// Why the shared config could not be read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigStoreError {
    /// NATS or JetStream did not answer (down, or started without JetStream).
    #[error("the shared config store (NATS KV bucket {CONFIG_BUCKET}) is unavailable: {0}")]
    Unavailable(String),
    /// Another writer changed the config since it was read.
    #[error("the shared config kept changing while this change was being made")]
    Conflict,
    /// The stored value is not a valid router config (written by something else).
    #[error("the shared config at revision {revision} is invalid: {message}")]
    Invalid {
        /// Its revision.
        revision: u64,
        /// Why.
        message: String,
    },
}

/// A config and the revision it was stored at.
#[derive(Debug, Clone, PartialEq)]
pub struct Versioned {
    /// The config.
    pub config: RouterConfig,
    /// Its NATS KV revision.
    pub version: u64,
}

/// The bucket, opened.
pub struct ConfigStore {
    kv: kv::Store,
}

fn unavailable(e: impl std::fmt::Display) -> ConfigStoreError {
    ConfigStoreError::Unavailable(e.to_string())
}

impl ConfigStore {
    /// Opens the bucket, creating it if no replica has yet.
    ///
    /// # Errors
    /// [`ConfigStoreError::Unavailable`].
    pub async fn open(nats: &async_nats::Client) -> Result<ConfigStore, ConfigStoreError> {
        let js = async_nats::jetstream::new(nats.clone());
        let kv = match js.get_key_value(CONFIG_BUCKET).await {
            Ok(kv) => kv,
            Err(_) => js
                .create_or_update_key_value(kv::Config {
                    bucket: CONFIG_BUCKET.to_string(),
                    description: "Switchyard router config, shared by the control-plane replicas"
                        .into(),
                    history: 16,
                    ..Default::default()
                })
                .await
                .map_err(unavailable)?,
        };
        Ok(ConfigStore { kv })
    }

    /// The stored config, if any replica wrote one.
    ///
    /// # Errors
    /// [`ConfigStoreError::Unavailable`], or [`ConfigStoreError::Invalid`].
    pub async fn current(&self) -> Result<Option<Versioned>, ConfigStoreError> {
        match self.kv.entry(CONFIG_KEY).await.map_err(unavailable)? {
            Some(entry) if entry.operation == Operation::Put => {
                parse(&entry.value, entry.revision).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// Stores `config` if the stored revision is still `expected` (0: nothing stored yet);
    /// the new revision.
    ///
    /// # Errors
    /// [`ConfigStoreError::Conflict`] when another write came first, else
    /// [`ConfigStoreError::Unavailable`].
    pub async fn write(
        &self,
        config: &RouterConfig,
        expected: u64,
    ) -> Result<u64, ConfigStoreError> {
        let bytes = serde_json::to_vec(config).map_err(unavailable)?;
        if expected == 0 {
            self.kv
                .create(CONFIG_KEY, bytes.into())
                .await
                .map_err(|e| match e.kind() {
                    CreateErrorKind::AlreadyExists => ConfigStoreError::Conflict,
                    _ => unavailable(e),
                })
        } else {
            self.kv
                .update(CONFIG_KEY, bytes.into(), expected)
                .await
                .map_err(|e| match e.kind() {
                    UpdateErrorKind::WrongLastRevision => ConfigStoreError::Conflict,
                    _ => unavailable(e),
                })
        }
    }
}

fn parse(value: &[u8], revision: u64) -> Result<Versioned, ConfigStoreError> {
    let invalid = |message: String| ConfigStoreError::Invalid { revision, message };
    let json: serde_json::Value =
        serde_json::from_slice(value).map_err(|e| invalid(e.to_string()))?;
    let config = RouterConfig::from_json(&json).map_err(|e| invalid(e.to_string()))?;
    Ok(Versioned {
        config,
        version: revision,
    })
}

/// Applies `patch` to the shared config with a compare-and-set, retrying on a concurrent
/// write; the new config, applied to this replica at once (the others apply it from their
/// watch).
///
/// # Errors
/// `Ok(Err(_))` when the patch is invalid (nothing written); `Err` when the store is
/// unavailable or keeps changing under the writer.
pub async fn patch(
    nats: &async_nats::Client,
    service: &ServiceHandle,
    patch: &serde_json::Value,
    if_match: Option<&IfMatch>,
) -> Result<Result<Versioned, PatchRefusal>, ConfigStoreError> {
    tokio::time::timeout(PATCH_TIMEOUT, patch_store(nats, service, patch, if_match))
        .await
        .unwrap_or_else(|_| {
            Err(unavailable(format!(
                "no answer within {} s",
                PATCH_TIMEOUT.as_secs()
            )))
        })
}

async fn patch_store(
    nats: &async_nats::Client,
    service: &ServiceHandle,
    patch: &serde_json::Value,
    if_match: Option<&IfMatch>,
) -> Result<Result<Versioned, PatchRefusal>, ConfigStoreError> {
    let store = ConfigStore::open(nats).await?;
    for _ in 0..WRITE_ATTEMPTS {
        let (base, expected, stored) = match store.current().await? {
            Some(v) => (v.config, v.version, true),
            None => (service.config().await.map_err(unavailable)?, 0, false),
        };
        // Checked against the revision the write below compares-and-sets on, so a change
        // that lands in between fails the write and is checked again.
        if if_match.is_some_and(|condition| !condition.admits(expected)) {
            return Ok(Err(PatchRefusal::Stale { current: expected }));
        }
        let next = match base.apply_json_patch(patch) {
            Ok(next) => next,
            Err(e) => return Ok(Err(e.into())),
        };
        // A change that changes nothing writes no revision: the version, and every
        // operator's `If-Match` on it, still holds.
        if stored && next == base {
            return Ok(Ok(Versioned {
                config: next,
                version: expected,
            }));
        }
        match store.write(&next, expected).await {
            Ok(version) => {
                // `next` passed the same validation the owner runs: this cannot refuse it.
                // The revision just written is the store's current one, whatever its number.
                if let Err(e) = service
                    .set_shared_config(next.clone(), version, true)
                    .await
                    .map_err(unavailable)?
                {
                    return Ok(Err(e.into()));
                }
                return Ok(Ok(Versioned {
                    config: next,
                    version,
                }));
            }
            Err(ConfigStoreError::Conflict) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(ConfigStoreError::Conflict)
}

/// Keeps this replica's config in step with the bucket until the router owner stops:
/// publishes the start-up config if the bucket has none, then applies every revision it
/// watches. Reconnects with backoff while NATS or JetStream is unavailable.
pub async fn follow(nats: async_nats::Client, service: ServiceHandle, metrics: Metrics) {
    let mut delay = Duration::from_millis(200);
    loop {
        match follow_once(&nats, &service, &metrics).await {
            Ok(()) => return,
            Err(error) => {
                tracing::warn!(%error, "shared config: retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// One session of [`follow`]: `Ok` when the router owner stopped.
async fn follow_once(
    nats: &async_nats::Client,
    service: &ServiceHandle,
    metrics: &Metrics,
) -> Result<(), ConfigStoreError> {
    let store = ConfigStore::open(nats).await?;
    let Ok(local) = service.config().await else {
        return Ok(());
    };
    if let Some(shared) = store.current().await? {
        // The bucket is the fleet's source of truth, so a replica started with other
        // settings takes the bucket's: say so, or the flags look silently ignored.
        if shared.config != local {
            tracing::warn!(
                version = shared.version,
                "the shared config in the NATS KV bucket differs from this replica's start-up \
                 settings (--serving-mode, --conditional-disagg-config); the shared one applies: \
                 change it with PUT /v1/config"
            );
        }
    } else {
        match store.write(&local, 0).await {
            Ok(version) => {
                tracing::info!(
                    version,
                    "shared config created from this replica's start-up config"
                );
            }
            Err(ConfigStoreError::Conflict) => {}
            Err(e) => return Err(e),
        }
    }
    let mut watch = store
        .kv
        .watch_with_history(CONFIG_KEY)
        .await
        .map_err(unavailable)?;
    let mut check = tokio::time::interval(STORE_CHECK_INTERVAL);
    check.tick().await;
    // The latest revision watched; the first one of a session is the store's current one.
    let mut watched: Option<u64> = None;
    let mut behind_checks = 0;
    loop {
        tokio::select! {
            entry = watch.next() => {
                let Some(entry) = entry else {
                    return Err(unavailable("the config watch ended"));
                };
                let entry = entry.map_err(unavailable)?;
                if entry.operation != Operation::Put {
                    continue;
                }
                let current = watched.is_none();
                watched = Some(entry.revision);
                match parse(&entry.value, entry.revision) {
                    Ok(v) => {
                        if service
                            .set_shared_config(v.config, v.version, current)
                            .await
                            .is_err()
                        {
                            return Ok(());
                        }
                    }
                    Err(error) => {
                        metrics.bad_message("shared_config");
                        tracing::warn!(%error, "shared config ignored");
                    }
                }
            }
            _ = check.tick() => {
                let stored = store.current().await?.map(|v| v.version);
                match store_drift(watched, stored) {
                    StoreDrift::InStep => behind_checks = 0,
                    StoreDrift::Restarted => {
                        return Err(unavailable(
                            "the store's revisions restarted (its JetStream data was lost): following it again",
                        ));
                    }
                    StoreDrift::Behind => {
                        // A revision may be on its way; twice in a row, the watch is stuck.
                        behind_checks += 1;
                        if behind_checks >= 2 {
                            return Err(unavailable("the config watch fell behind the store"));
                        }
                    }
                }
            }
        }
    }
}

/// How the store's current revision compares with the latest one watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StoreDrift {
    /// The same (or nothing stored and nothing watched yet).
    InStep,
    /// The store is behind what was watched, or empty after holding a config: its data was
    /// lost and its revisions start again.
    Restarted,
    /// The store holds a revision the watch has not delivered.
    Behind,
}

fn store_drift(watched: Option<u64>, stored: Option<u64>) -> StoreDrift {
    match (watched, stored) {
        (Some(w), Some(s)) if s < w => StoreDrift::Restarted,
        (Some(_), None) => StoreDrift::Restarted,
        (Some(w), Some(s)) if s > w => StoreDrift::Behind,
        (None, Some(_)) => StoreDrift::Behind,
        _ => StoreDrift::InStep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_behind_or_emptied_restarted_its_revisions() {
        assert_eq!(store_drift(Some(31), Some(31)), StoreDrift::InStep);
        assert_eq!(store_drift(None, None), StoreDrift::InStep);
        assert_eq!(store_drift(Some(31), Some(1)), StoreDrift::Restarted);
        assert_eq!(store_drift(Some(31), None), StoreDrift::Restarted);
        assert_eq!(store_drift(Some(31), Some(32)), StoreDrift::Behind);
        assert_eq!(store_drift(None, Some(1)), StoreDrift::Behind);
    }
}
