//! Signed worker registrations (feature `registration`).
//!
//! A heartbeat registers a worker: whoever can publish one on NATS could add any address to
//! Envoy's pools and receive client prompts. So a control plane configured with a
//! registration secret accepts a heartbeat only when it carries an HMAC-SHA256, keyed with
//! that secret, over the worker's description and the time it was sent. Why a MAC and not the
//! secret itself: every subscriber on the bus sees heartbeats, so a secret sent in clear would
//! be one subscription away from anyone; a MAC reveals nothing, and a recorded heartbeat is
//! only good for [`MAX_CLOCK_SKEW_MS`] and only for the address it names.
//!
//! The signed text is fixed (the version `v1`, then every [`WorkerInfo`] field and the send
//! time, separated by newlines), not the JSON, so a newer worker's extra fields cannot break
//! verification on an older control plane.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::worker::WorkerInfo;

/// How far a heartbeat's send time may be from the receiver's clock, either way.
pub const MAX_CLOCK_SKEW_MS: u64 = 60_000;

/// Shortest registration secret accepted (bytes): an HMAC key is only as strong as it is long.
pub const MIN_SECRET_BYTES: usize = 16;

/// Unix milliseconds now, the clock a signed heartbeat's `sent_at_ms` is on: the sender signs
/// with it and the receiver checks the skew against its own; control-plane replicas stamp
/// their shared updates with it to measure how stale they arrive.
pub fn unix_now_ms() -> u64 {
    #[allow(clippy::disallowed_methods)]
    let now = std::time::SystemTime::now();
    now.duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

type HmacSha256 = Hmac<Sha256>;

/// The key of signed registrations.
#[derive(Clone)]
pub struct RegistrationSecret(Vec<u8>);

impl std::fmt::Debug for RegistrationSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RegistrationSecret(..)")
    }
}

/// Why a secret or a signature is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistrationError {
    /// The secret is shorter than [`MIN_SECRET_BYTES`].
    #[error("the registration secret has {0} bytes; at least {MIN_SECRET_BYTES} are needed")]
    SecretTooShort(usize),
    /// The heartbeat carries no signature.
    #[error("the heartbeat is not signed")]
    Unsigned,
    /// The signature does not match (another secret, or a changed message).
    #[error("the heartbeat's signature does not match")]
    BadSignature,
    /// The send time is too far from the receiver's clock.
    #[error("the heartbeat was sent {skew_ms} ms away from this host's clock (at most {MAX_CLOCK_SKEW_MS})")]
    Stale {
        /// The difference, in milliseconds.
        skew_ms: u64,
    },
}

impl RegistrationSecret {
    /// A secret from its text; surrounding whitespace (a file's newline) is ignored.
    ///
    /// # Errors
    /// [`RegistrationError::SecretTooShort`].
    pub fn new(text: &str) -> Result<Self, RegistrationError> {
        let bytes = text.trim().as_bytes().to_vec();
        if bytes.len() < MIN_SECRET_BYTES {
            return Err(RegistrationError::SecretTooShort(bytes.len()));
        }
        Ok(RegistrationSecret(bytes))
    }

    fn mac(&self, info: &WorkerInfo, sent_at_ms: u64) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(signed_text(info, sent_at_ms).as_bytes());
        mac
    }

    /// The signature of `info` sent at `sent_at_ms` (Unix milliseconds), as lower-case hex.
    pub fn sign(&self, info: &WorkerInfo, sent_at_ms: u64) -> String {
        hex(&self.mac(info, sent_at_ms).finalize().into_bytes())
    }

    /// Checks a signature in constant time, and the send time against `now_ms` (Unix
    /// milliseconds on the receiver).
    ///
    /// # Errors
    /// The [`RegistrationError`] saying why the heartbeat is refused.
    pub fn verify(
        &self,
        info: &WorkerInfo,
        sent_at_ms: u64,
        signature: Option<&str>,
        now_ms: u64,
    ) -> Result<(), RegistrationError> {
        let signature = signature.ok_or(RegistrationError::Unsigned)?;
        let bytes = unhex(signature).ok_or(RegistrationError::BadSignature)?;
        self.mac(info, sent_at_ms)
            .verify_slice(&bytes)
            .map_err(|_| RegistrationError::BadSignature)?;
        let skew_ms = now_ms.abs_diff(sent_at_ms);
        if skew_ms > MAX_CLOCK_SKEW_MS {
            return Err(RegistrationError::Stale { skew_ms });
        }
        Ok(())
    }
}

fn signed_text(info: &WorkerInfo, sent_at_ms: u64) -> String {
    // A vLLM worker without a bootstrap port signs the `v1` text, so registrations from
    // before engines other than vLLM still verify; anything else signs `v2`, which covers
    // the engine and the bootstrap port too (they steer where a decode worker connects).
    if !info.engine.is_vllm() || info.bootstrap_port.is_some() {
        return format!(
            "v2\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}",
            info.worker_id,
            info.instance_id,
            info.role.as_str(),
            info.address,
            info.model,
            info.block_size,
            info.kv_capacity_blocks,
            info.engine.as_str(),
            info.bootstrap_port
                .map(|p| p.to_string())
                .unwrap_or_default(),
            sent_at_ms
        );
    }
    format!(
        "v1\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}",
        info.worker_id,
        info.instance_id,
        info.role.as_str(),
        info.address,
        info.model,
        info.block_size,
        info.kv_capacity_blocks,
        sent_at_ms
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::{WorkerId, WorkerRole};

    fn info() -> WorkerInfo {
        WorkerInfo {
            worker_id: WorkerId("decode-0".into()),
            instance_id: 7,
            role: WorkerRole::Decode,
            address: "127.0.0.1:9000".into(),
            model: "m".into(),
            block_size: 64,
            kv_capacity_blocks: 100,
            engine: Default::default(),
            bootstrap_port: None,
        }
    }

    #[test]
    fn a_signed_heartbeat_verifies_and_any_change_breaks_it() {
        let secret = RegistrationSecret::new("0123456789abcdef-secret").unwrap();
        let sig = secret.sign(&info(), 1_000);
        assert_eq!(sig.len(), 64);
        assert_eq!(secret.verify(&info(), 1_000, Some(&sig), 2_000), Ok(()));
        let mut moved = info();
        moved.address = "127.0.0.1:18999".into();
        assert_eq!(
            secret.verify(&moved, 1_000, Some(&sig), 2_000),
            Err(RegistrationError::BadSignature)
        );
        assert_eq!(
            secret.verify(&info(), 1_001, Some(&sig), 2_000),
            Err(RegistrationError::BadSignature)
        );
        // The engine and the bootstrap port are covered: a recorded heartbeat cannot be
        // replayed as another engine's, or point decode workers at another port.
        let sglang = WorkerInfo {
            engine: crate::worker::Engine::Sglang,
            bootstrap_port: Some(8998),
            ..info()
        };
        let sig_sglang = secret.sign(&sglang, 1_000);
        assert_eq!(
            secret.verify(&sglang, 1_000, Some(&sig_sglang), 2_000),
            Ok(())
        );
        for changed in [
            WorkerInfo {
                bootstrap_port: Some(8999),
                ..sglang.clone()
            },
            WorkerInfo {
                engine: crate::worker::Engine::Trtllm,
                ..sglang.clone()
            },
            info(),
        ] {
            assert_eq!(
                secret.verify(&changed, 1_000, Some(&sig_sglang), 2_000),
                Err(RegistrationError::BadSignature)
            );
        }
        let other = RegistrationSecret::new("another-secret-of-16+").unwrap();
        assert_eq!(
            other.verify(&info(), 1_000, Some(&sig), 2_000),
            Err(RegistrationError::BadSignature)
        );
        assert_eq!(
            secret.verify(&info(), 1_000, None, 2_000),
            Err(RegistrationError::Unsigned)
        );
        assert_eq!(
            secret.verify(&info(), 1_000, Some("zz"), 2_000),
            Err(RegistrationError::BadSignature)
        );
    }

    #[test]
    fn an_old_recording_is_refused() {
        let secret = RegistrationSecret::new("0123456789abcdef").unwrap();
        let sig = secret.sign(&info(), 1_000);
        let late = 1_000 + MAX_CLOCK_SKEW_MS + 1;
        assert_eq!(
            secret.verify(&info(), 1_000, Some(&sig), late),
            Err(RegistrationError::Stale {
                skew_ms: MAX_CLOCK_SKEW_MS + 1
            })
        );
    }

    #[test]
    fn short_secrets_are_refused_and_whitespace_is_trimmed() {
        assert_eq!(
            RegistrationSecret::new(" short \n").unwrap_err(),
            RegistrationError::SecretTooShort(5)
        );
        let a = RegistrationSecret::new("0123456789abcdef\n").unwrap();
        let b = RegistrationSecret::new("0123456789abcdef").unwrap();
        assert_eq!(a.sign(&info(), 5), b.sign(&info(), 5));
    }
}
