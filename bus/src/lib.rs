//! Switchyard's connection to its event bus, NATS, as every component makes it.
//!
//! Workers publish heartbeats (their registrations), load reports and KV events on NATS; the
//! control plane consumes them. Anyone who can publish there can register a worker and so
//! receive client prompts, so deployments run NATS with credentials ([`NatsArgs`]: a token,
//! a user and password, an nkey seed or a `.creds` file, optionally over TLS) and the control
//! plane accepts only registrations signed with the deployment's registration secret
//! ([`RegistrationArgs`], `switchyard_protocol::registration`). Secrets come from files (a
//! mounted Kubernetes Secret, say), never from the command line, where `ps` would show them.
//!
//! Connections are made the same way everywhere ([`connect`]): in the background, retrying
//! forever at most a second apart, so a component started before its NATS server still
//! joins, and one that lost NATS is back within about a second of the server's return.
//! [`watch_connection`] turns the client's connection state, and whether the server echoes
//! what the client sends through it ([`echo`]), into a watch channel, which the control plane
//! uses to stop expiring workers while it cannot hear them.
#![deny(missing_docs)]

pub mod echo;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

use switchyard_protocol::registration::{RegistrationError, RegistrationSecret};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Longest wait between two reconnection attempts.
pub const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(1);
/// How often [`watch_connection`] looks at the client's state.
pub const CONNECTION_POLL: Duration = Duration::from_millis(100);
/// How long a connection may stay up without any echo back before [`watch_connection`] says
/// that it cannot tell a silent server (see [`echo`]).
const UNPROVEN_ECHO_WARNING: Duration = Duration::from_secs(5);

/// How to reach NATS: the URL and the credentials, as flags with environment fallbacks.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct NatsArgs {
    /// NATS server URL; several may be given comma-separated. `tls://` requires TLS.
    #[arg(
        long,
        env = "SWITCHYARD_NATS_URL",
        default_value = "nats://127.0.0.1:4222"
    )]
    pub nats_url: String,
    /// File holding the NATS token (nats-server `authorization { token: ... }` or `--auth`).
    #[arg(long, env = "SWITCHYARD_NATS_TOKEN_FILE")]
    pub nats_token_file: Option<PathBuf>,
    /// NATS user name; needs `--nats-password-file`.
    #[arg(long, env = "SWITCHYARD_NATS_USER")]
    pub nats_user: Option<String>,
    /// File holding the NATS user's password.
    #[arg(long, env = "SWITCHYARD_NATS_PASSWORD_FILE")]
    pub nats_password_file: Option<PathBuf>,
    /// File holding an nkey seed (`SU...`).
    #[arg(long, env = "SWITCHYARD_NATS_NKEY_FILE")]
    pub nats_nkey_file: Option<PathBuf>,
    /// A NATS `.creds` file (user JWT and nkey seed, as `nsc` writes them).
    #[arg(long, env = "SWITCHYARD_NATS_CREDS_FILE")]
    pub nats_creds_file: Option<PathBuf>,
    /// PEM file of the CA that signed the server's certificate; turns TLS on.
    #[arg(long, env = "SWITCHYARD_NATS_TLS_CA_FILE")]
    pub nats_tls_ca_file: Option<PathBuf>,
    /// PEM client certificate for mutual TLS (with `--nats-tls-key-file`).
    #[arg(long, env = "SWITCHYARD_NATS_TLS_CERT_FILE")]
    pub nats_tls_cert_file: Option<PathBuf>,
    /// PEM private key of `--nats-tls-cert-file`.
    #[arg(long, env = "SWITCHYARD_NATS_TLS_KEY_FILE")]
    pub nats_tls_key_file: Option<PathBuf>,
}

/// The workers' registration secret, as a flag with an environment fallback.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct RegistrationArgs {
    /// File holding the registration secret (at least 16 bytes). Workers sign their
    /// heartbeats with it; a control plane that has it refuses unsigned ones.
    #[arg(long, env = "SWITCHYARD_REGISTRATION_SECRET_FILE")]
    pub registration_secret_file: Option<PathBuf>,
}

/// Why a connection could not even be attempted.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// A credentials file could not be read.
    #[error("--{flag} {}: {source}", path.display())]
    ReadFile {
        /// The flag naming the file.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
    /// A file that must hold a secret is empty.
    #[error("--{flag} {}: the file is empty", path.display())]
    EmptyFile {
        /// The flag naming the file.
        flag: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// A TLS file that holds no PEM block of the kind its flag needs.
    #[error("--{flag} {}: no PEM {what} in it (-----BEGIN ...-----)", path.display())]
    NotPem {
        /// The flag naming the file.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// What it should hold: `certificate` or `private key`.
        what: &'static str,
    },
    /// The flags do not make one way of authenticating.
    #[error("NATS credentials: {0}")]
    Conflict(String),
    /// The registration secret is unusable.
    #[error("--registration-secret-file {}: {source}", path.display())]
    Secret {
        /// The file.
        path: PathBuf,
        /// Why.
        source: RegistrationError,
    },
    /// The URL is unusable.
    #[error("--nats-url {url}: {message}")]
    Url {
        /// The URL given.
        url: String,
        /// What async-nats said.
        message: String,
    },
}

/// Reads a secret file, trimmed.
fn read_secret(flag: &'static str, path: &Path) -> Result<String, BusError> {
    let text = std::fs::read_to_string(path).map_err(|source| BusError::ReadFile {
        flag,
        path: path.to_path_buf(),
        source,
    })?;
    let text = text.trim().to_string();
    if text.is_empty() {
        return Err(BusError::EmptyFile {
            flag,
            path: path.to_path_buf(),
        });
    }
    Ok(text)
}

/// Checks that a TLS file can be read and holds a PEM block whose label ends with `label`
/// (`CERTIFICATE`, `PRIVATE KEY`): async-nats reads it only when it connects, and a missing
/// or wrong file then reads as an unreachable server, retried for ever.
fn check_pem(
    flag: &'static str,
    path: &Path,
    label: &str,
    what: &'static str,
) -> Result<(), BusError> {
    let text = std::fs::read(path).map_err(|source| BusError::ReadFile {
        flag,
        path: path.to_path_buf(),
        source,
    })?;
    let text = String::from_utf8_lossy(&text);
    let pem = text.lines().any(|line| {
        line.trim()
            .strip_prefix("-----BEGIN ")
            .and_then(|rest| rest.strip_suffix("-----"))
            .is_some_and(|kind| kind.ends_with(label))
    });
    if pem {
        Ok(())
    } else {
        Err(BusError::NotPem {
            flag,
            path: path.to_path_buf(),
            what,
        })
    }
}

impl NatsArgs {
    /// Connects with the defaults (`nats://127.0.0.1:4222`, no credentials) to `url`.
    pub fn plain(url: impl Into<String>) -> Self {
        NatsArgs {
            nats_url: url.into(),
            ..NatsArgs::default()
        }
    }

    /// Whether any credentials are configured.
    pub fn has_credentials(&self) -> bool {
        self.nats_token_file.is_some()
            || self.nats_user.is_some()
            || self.nats_nkey_file.is_some()
            || self.nats_creds_file.is_some()
    }

    /// The connect options these flags describe: credentials read, TLS set, reconnects
    /// forever at most [`MAX_RECONNECT_DELAY`] apart. `name` is the client name the server
    /// shows.
    ///
    /// # Errors
    /// [`BusError`] naming the flag at fault.
    pub async fn options(&self, name: &str) -> Result<async_nats::ConnectOptions, BusError> {
        let ways = [
            self.nats_token_file.is_some(),
            self.nats_user.is_some() || self.nats_password_file.is_some(),
            self.nats_nkey_file.is_some(),
            self.nats_creds_file.is_some(),
        ];
        if ways.iter().filter(|w| **w).count() > 1 {
            return Err(BusError::Conflict(
                "give one of --nats-token-file, --nats-user/--nats-password-file, --nats-nkey-file or --nats-creds-file".into(),
            ));
        }
        let mut options = async_nats::ConnectOptions::new()
            .name(name)
            .retry_on_initial_connect()
            .max_reconnects(None)
            .connection_timeout(Duration::from_secs(2))
            .reconnect_delay_callback(reconnect_delay);
        if let Some(path) = &self.nats_token_file {
            options = options.token(read_secret("nats-token-file", path)?);
        }
        match (&self.nats_user, &self.nats_password_file) {
            (Some(user), Some(path)) => {
                let password = read_secret("nats-password-file", path)?;
                options = options.user_and_password(user.clone(), password);
            }
            (None, None) => {}
            _ => {
                return Err(BusError::Conflict(
                    "--nats-user and --nats-password-file go together".into(),
                ))
            }
        }
        if let Some(path) = &self.nats_nkey_file {
            options = options.nkey(read_secret("nats-nkey-file", path)?);
        }
        if let Some(path) = &self.nats_creds_file {
            options =
                options
                    .credentials_file(path)
                    .await
                    .map_err(|source| BusError::ReadFile {
                        flag: "nats-creds-file",
                        path: path.clone(),
                        source,
                    })?;
        }
        if let Some(ca) = &self.nats_tls_ca_file {
            check_pem("nats-tls-ca-file", ca, "CERTIFICATE", "certificate")?;
            options = options.require_tls(true).add_root_certificates(ca.clone());
        }
        match (&self.nats_tls_cert_file, &self.nats_tls_key_file) {
            (Some(cert), Some(key)) => {
                check_pem("nats-tls-cert-file", cert, "CERTIFICATE", "certificate")?;
                check_pem("nats-tls-key-file", key, "PRIVATE KEY", "private key")?;
                options = options
                    .require_tls(true)
                    .add_client_certificate(cert.clone(), key.clone());
            }
            (None, None) => {}
            _ => {
                return Err(BusError::Conflict(
                    "--nats-tls-cert-file and --nats-tls-key-file go together".into(),
                ))
            }
        }
        Ok(options)
    }
}

/// The pause before reconnection attempt `attempts`: 100 ms more each time, at most
/// [`MAX_RECONNECT_DELAY`]. Short on purpose: routing state goes stale while NATS is away,
/// and a reconnect attempt costs the server next to nothing.
pub fn reconnect_delay(attempts: usize) -> Duration {
    let ms = (attempts as u64).saturating_mul(100);
    Duration::from_millis(ms).min(MAX_RECONNECT_DELAY)
}

impl RegistrationArgs {
    /// The secret, if a file is configured.
    ///
    /// # Errors
    /// [`BusError`] when the file cannot be read or the secret is too short.
    pub fn secret(&self) -> Result<Option<RegistrationSecret>, BusError> {
        let Some(path) = &self.registration_secret_file else {
            return Ok(None);
        };
        let text = read_secret("registration-secret-file", path)?;
        RegistrationSecret::new(&text)
            .map(Some)
            .map_err(|source| BusError::Secret {
                path: path.clone(),
                source,
            })
    }
}

/// Connects as `args` say, in the background (the client is returned at once and retries
/// until the server accepts it). `on_event` sees every connection event (log it, count it;
/// [`ignore_event`] drops it).
///
/// A plain function pointer rather than a generic callback on purpose: generic, this function
/// and async-nats's whole connector would be compiled again in every crate that calls it.
///
/// # Errors
/// [`BusError`] for unusable flags or URL; an unreachable server is not an error.
pub async fn connect(
    args: &NatsArgs,
    name: &str,
    on_event: fn(async_nats::Event),
) -> Result<async_nats::Client, BusError> {
    let options = args
        .options(name)
        .await?
        .event_callback(move |event| async move { on_event(event) });
    options
        .connect(server_addrs(&args.nats_url)?)
        .await
        .map_err(|e| BusError::Url {
            url: args.nats_url.clone(),
            message: e.to_string(),
        })
}

/// The servers of a `--nats-url`: one URL, or several separated by commas (the client tries
/// them in turn, and reconnects to whichever answers).
///
/// # Errors
/// [`BusError::Url`] naming the server that does not parse.
pub fn server_addrs(urls: &str) -> Result<Vec<async_nats::ServerAddr>, BusError> {
    let servers = urls
        .split(',')
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .map(|url| {
            url.parse::<async_nats::ServerAddr>()
                .map_err(|e| BusError::Url {
                    url: urls.to_owned(),
                    message: format!("server {url:?}: {e}"),
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if servers.is_empty() {
        return Err(BusError::Url {
            url: urls.to_owned(),
            message: "no server given".into(),
        });
    }
    Ok(servers)
}

/// A connection-event callback for [`connect`] that does nothing.
pub fn ignore_event(_: async_nats::Event) {}

/// Which failure to connect was last said ([`FAILURE_NONE`], [`FAILURE_UNREACHABLE`],
/// [`FAILURE_REFUSED`]): each is said once per outage, since the client retries about every
/// second (a deployment with only declared pools may run no NATS at all), and a change of
/// kind is said again (a server that comes up refusing the client's credentials).
static CONNECT_FAILURE_SAID: AtomicU8 = AtomicU8::new(FAILURE_NONE);
const FAILURE_NONE: u8 = 0;
const FAILURE_UNREACHABLE: u8 = 1;
const FAILURE_REFUSED: u8 = 2;

/// A connection-event callback for [`connect`] that logs what an operator needs: connected,
/// lost, and why it cannot connect, once per outage. A server that refuses the client's
/// credentials is named as such, with the flags that give them: async-nats alone logs
/// "authorization violation" every second, which does not say whose.
pub fn log_event(event: async_nats::Event) {
    match event {
        async_nats::Event::Connected => {
            CONNECT_FAILURE_SAID.store(FAILURE_NONE, Ordering::Relaxed);
            tracing::info!("connected to NATS");
        }
        async_nats::Event::Disconnected => {
            tracing::warn!("NATS connection lost; reconnecting (HTTP keeps serving)")
        }
        async_nats::Event::ClientError(e) => {
            let kind = if is_credentials_refused(&e) {
                FAILURE_REFUSED
            } else {
                FAILURE_UNREACHABLE
            };
            if CONNECT_FAILURE_SAID.swap(kind, Ordering::Relaxed) == kind {
                tracing::debug!(error = %e, "cannot connect to NATS; retrying");
            } else if kind == FAILURE_REFUSED {
                tracing::warn!(error = %e, "NATS refused this client's credentials; retrying every second or so, said once until it connects (HTTP keeps serving): give the server's credentials with --nats-token-file, --nats-user and --nats-password-file, --nats-nkey-file or --nats-creds-file");
            } else {
                tracing::warn!(error = %e, "NATS unreachable; retrying every second or so, said once until it connects (HTTP keeps serving)");
            }
        }
        async_nats::Event::SlowConsumer(sid) => slow_consumer(sid),
        other => tracing::info!(event = %other, "NATS"),
    }
}

/// Times the client reported a subscription whose buffer was full ([`log_event`]): each is a
/// message async-nats dropped without delivering it (at least: a report that finds the event
/// queue full is lost too). Read with [`slow_consumer_events`].
static SLOW_CONSUMER_EVENTS: AtomicU64 = AtomicU64::new(0);

/// How many dropped-message reports [`log_event`] has seen in this process (see
/// [`SLOW_CONSUMER_EVENTS`]); a caller folds it into its metrics.
pub fn slow_consumer_events() -> u64 {
    SLOW_CONSUMER_EVENTS.load(Ordering::Relaxed)
}

/// Counts a dropped-message report, and says it at the 1st, 2nd, 4th, 8th… (each drop is one
/// report, so a flood of them must not flood the log).
fn slow_consumer(sid: u64) {
    let n = SLOW_CONSUMER_EVENTS.fetch_add(1, Ordering::Relaxed) + 1;
    if n.is_power_of_two() {
        tracing::warn!(subscription = sid, dropped_so_far = n, "NATS messages dropped: a subscription's buffer was full (the consumer fell behind; KV gaps this leaves are resynced)");
    }
}

/// Whether a connection error is the server refusing the client's credentials (async-nats
/// reports it as text only).
fn is_credentials_refused(error: &async_nats::ClientError) -> bool {
    let async_nats::ClientError::Other(text) = error else {
        return false;
    };
    [
        async_nats::ConnectErrorKind::AuthorizationViolation,
        async_nats::ConnectErrorKind::Authentication,
    ]
    .iter()
    .any(|kind| *text == kind.to_string())
}

/// Whether the client is connected now.
pub fn is_connected(client: &async_nats::Client) -> bool {
    client.connection_state() == async_nats::connection::State::Connected
}

/// A watch of whether the server can be heard (true: connected, and answering its echoes, see
/// [`echo`]), refreshed every [`CONNECTION_POLL`] by a task that ends when every receiver is
/// dropped.
pub fn watch_connection(client: async_nats::Client) -> (watch::Receiver<bool>, JoinHandle<()>) {
    let (tx, rx) = watch::channel(is_connected(&client));
    let task = tokio::spawn(async move {
        // Echoes go to this client's own inbox subject, which NATS permissions leave open for
        // request-reply.
        let subject = client.new_inbox();
        let mut echoes = match client.subscribe(subject.clone()).await {
            Ok(subscriber) => Some(subscriber),
            Err(e) => {
                tracing::warn!(error = %e, "cannot subscribe to NATS echoes; judging the connection by its state alone");
                None
            }
        };
        let mut probe = echo::EchoProbe::default();
        // Since when the connection has been up without an echo back, and whether that was
        // said (once per connection).
        let mut unproven_since: Option<tokio::time::Instant> = None;
        let mut unproven_said = false;
        // Whether the last state was connected but silent (its end is worth a line).
        let mut was_silent = false;
        let mut tick = tokio::time::interval(CONNECTION_POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let echoed = async {
                match echoes.as_mut() {
                    Some(subscriber) => next_message(subscriber).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                message = echoed => {
                    match message {
                        Some(m) => {
                            if let Some(n) = std::str::from_utf8(&m.payload).ok().and_then(|t| t.parse().ok()) {
                                probe.echoed(n);
                            }
                        }
                        // The subscription ended (the client is closing): judge by the
                        // connection state alone from here.
                        None => echoes = None,
                    }
                    continue;
                }
                _ = tick.tick() => {}
            }
            let connected = is_connected(&client);
            let at = tokio::time::Instant::now();
            let (send, answering) = if echoes.is_some() {
                probe.tick(at, connected)
            } else {
                (None, connected)
            };
            if !connected || probe.proven() || echoes.is_none() {
                unproven_since = None;
                unproven_said &= connected;
            } else {
                let since = *unproven_since.get_or_insert(at);
                if !unproven_said && at.saturating_duration_since(since) >= UNPROVEN_ECHO_WARNING {
                    tracing::warn!(%subject, "no echo through NATS has come back: are this client's own _INBOX subjects allowed? A NATS server that stops answering goes unnoticed until its pings fail");
                    unproven_said = true;
                }
            }
            if let Some(n) = send {
                // Bounded: a server that reads nothing lets the client's queue fill.
                let publish = client.publish(subject.clone(), n.to_string().into());
                let _ = tokio::time::timeout(echo::ECHO_INTERVAL, publish).await;
            }
            let now = connected && answering;
            if tx.send_if_modified(|seen| std::mem::replace(seen, now) != now) {
                if connected && !answering {
                    tracing::warn!("NATS connected but not answering (no echo within {:?}): no worker expires while it is silent", echo::ECHO_TIMEOUT);
                } else if now && was_silent {
                    tracing::info!("NATS answering again");
                } else {
                    tracing::debug!(reachable = now, "NATS reachability changed");
                }
            }
            was_silent = connected && !answering;
            if tx.is_closed() {
                break;
            }
        }
    });
    (rx, task)
}

/// The next message of `subscriber` (`None` once it ended).
async fn next_message(subscriber: &mut async_nats::Subscriber) -> Option<async_nats::Message> {
    use futures::StreamExt;
    subscriber.next().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_subscription_buffer_is_counted() {
        let before = slow_consumer_events();
        log_event(async_nats::Event::SlowConsumer(3));
        log_event(async_nats::Event::SlowConsumer(3));
        // Other tests may log events meanwhile, but none of this kind.
        assert_eq!(slow_consumer_events(), before + 2);
    }

    fn file(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn scratch() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("switchyard-bus-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn refused_credentials_are_told_from_an_unreachable_server() {
        use async_nats::{ClientError, ConnectErrorKind};
        let refused = |kind: ConnectErrorKind| ClientError::Other(kind.to_string());
        assert!(is_credentials_refused(&refused(
            ConnectErrorKind::AuthorizationViolation
        )));
        assert!(is_credentials_refused(&refused(
            ConnectErrorKind::Authentication
        )));
        assert!(!is_credentials_refused(&refused(ConnectErrorKind::Io)));
        assert!(!is_credentials_refused(&refused(
            ConnectErrorKind::TimedOut
        )));
        assert!(!is_credentials_refused(&ClientError::MaxReconnects));
    }

    #[test]
    fn a_nats_url_may_list_several_servers() {
        let two = server_addrs("nats://127.0.0.1:4223, nats://127.0.0.1:4222").unwrap();
        assert_eq!(two.len(), 2);
        assert_eq!(two[1].port(), 4222);
        assert_eq!(
            server_addrs("127.0.0.1:4222,127.0.0.1:4223").unwrap().len(),
            2
        );
        let e = server_addrs("nats://127.0.0.1:4222,nats://x:notaport").unwrap_err();
        assert!(e.to_string().contains("\"nats://x:notaport\""), "{e}");
        assert!(server_addrs(" , ").is_err());
    }

    #[test]
    fn reconnects_back_off_to_a_second() {
        assert_eq!(reconnect_delay(0), Duration::ZERO);
        assert_eq!(reconnect_delay(3), Duration::from_millis(300));
        assert_eq!(reconnect_delay(50), MAX_RECONNECT_DELAY);
        assert_eq!(reconnect_delay(usize::MAX), MAX_RECONNECT_DELAY);
    }

    #[tokio::test]
    async fn credentials_conflicts_and_files_are_named() {
        let dir = scratch();
        let token = file(&dir, "token", "s3cret\n");
        let empty = file(&dir, "empty", " \n");
        let mut args = NatsArgs::plain("nats://127.0.0.1:1");
        args.nats_token_file = Some(token.clone());
        assert!(args.options("t").await.is_ok());
        assert!(args.has_credentials());
        args.nats_user = Some("u".into());
        let err = args.options("t").await.unwrap_err();
        assert!(matches!(err, BusError::Conflict(_)), "{err}");
        args.nats_token_file = None;
        let err = args.options("t").await.unwrap_err();
        assert!(err.to_string().contains("--nats-password-file"), "{err}");
        let mut args = NatsArgs::plain("nats://127.0.0.1:1");
        args.nats_token_file = Some(empty.clone());
        let err = args.options("t").await.unwrap_err();
        assert!(
            err.to_string().contains("nats-token-file") && err.to_string().contains("empty"),
            "{err}"
        );
        args.nats_token_file = Some(dir.join("missing"));
        assert!(matches!(
            args.options("t").await.unwrap_err(),
            BusError::ReadFile { .. }
        ));
    }

    #[tokio::test]
    async fn tls_files_are_checked_before_connecting() {
        let dir = scratch();
        let cert = file(
            &dir,
            "ca.pem",
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        );
        let key = file(
            &dir,
            "key.pem",
            "-----BEGIN EC PRIVATE KEY-----\nMHc\n-----END EC PRIVATE KEY-----\n",
        );
        let junk = file(&dir, "junk.pem", "not a certificate\n");
        let mut args = NatsArgs::plain("tls://127.0.0.1:1");
        args.nats_tls_ca_file = Some(cert.clone());
        args.nats_tls_cert_file = Some(cert.clone());
        args.nats_tls_key_file = Some(key.clone());
        assert!(args.options("t").await.is_ok());
        args.nats_tls_ca_file = Some(dir.join("missing"));
        let err = args.options("t").await.unwrap_err();
        assert!(
            matches!(
                err,
                BusError::ReadFile {
                    flag: "nats-tls-ca-file",
                    ..
                }
            ),
            "{err}"
        );
        args.nats_tls_ca_file = Some(junk.clone());
        let err = args.options("t").await.unwrap_err();
        assert!(
            err.to_string().contains("--nats-tls-ca-file") && err.to_string().contains("no PEM"),
            "{err}"
        );
        args.nats_tls_ca_file = None;
        // A certificate where the key belongs.
        args.nats_tls_key_file = Some(cert);
        let err = args.options("t").await.unwrap_err();
        assert!(
            matches!(
                err,
                BusError::NotPem {
                    flag: "nats-tls-key-file",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn registration_secrets_come_from_files_of_at_least_16_bytes() {
        let dir = scratch();
        assert!(RegistrationArgs::default().secret().unwrap().is_none());
        let args = RegistrationArgs {
            registration_secret_file: Some(file(&dir, "short", "abc\n")),
        };
        let err = args.secret().unwrap_err();
        assert!(err.to_string().contains("16"), "{err}");
        let args = RegistrationArgs {
            registration_secret_file: Some(file(&dir, "ok", "0123456789abcdef0123\n")),
        };
        assert!(args.secret().unwrap().is_some());
    }
}
