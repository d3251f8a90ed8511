//! The admin API's bearer token: where it comes from, and the check every admin endpoint
//! that changes or dumps state runs first.
//!
//! The check is a pure function of the configured token and the request's `Authorization`
//! header, so its outcomes are unit-tested without a server. The comparison runs in constant
//! time over SHA-256 digests of both tokens: neither the bytes nor the length of the
//! configured token can be learned from how long a refusal takes.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Shortest token accepted: a guessable admin token is no protection.
pub const MIN_ADMIN_TOKEN_LEN: usize = 16;

/// The configured admin token (its digest only: the token itself is not kept, and `Debug`
/// shows nothing of it).
#[derive(Clone)]
pub struct AdminToken {
    digest: [u8; 32],
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

/// Why the admin token could not be loaded. The service refuses to start with any of them.
#[derive(Debug, thiserror::Error)]
pub enum AdminTokenError {
    /// `--admin-token-file` cannot be read.
    #[error("--admin-token-file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The token (after trimming white space) is shorter than [`MIN_ADMIN_TOKEN_LEN`].
    #[error(
        "{origin}: the admin token must be at least {MIN_ADMIN_TOKEN_LEN} characters (found {len})"
    )]
    TooShort {
        /// Where it came from (the flag and file, or the environment variable).
        origin: String,
        /// Its length.
        len: usize,
    },
    /// Both a file and the environment variable name a token: which one is meant?
    #[error("both --admin-token-file and SWITCHYARD_ADMIN_TOKEN are set; use one")]
    Conflict,
}

impl AdminToken {
    /// The token from `file` (`--admin-token-file`) or from `env_value`
    /// (`SWITCHYARD_ADMIN_TOKEN`), trimmed; `None` when neither is set.
    ///
    /// # Errors
    /// [`AdminTokenError`] for an unreadable file, a short token, or both sources at once.
    pub fn load(
        file: Option<&Path>,
        env_value: Option<&str>,
    ) -> Result<Option<AdminToken>, AdminTokenError> {
        let (text, origin) = match (file, env_value) {
            (Some(_), Some(_)) => return Err(AdminTokenError::Conflict),
            (None, None) => return Ok(None),
            (Some(path), None) => {
                let text =
                    std::fs::read_to_string(path).map_err(|source| AdminTokenError::Read {
                        path: path.to_path_buf(),
                        source,
                    })?;
                (text, format!("--admin-token-file {}", path.display()))
            }
            (None, Some(value)) => (value.to_string(), "SWITCHYARD_ADMIN_TOKEN".to_string()),
        };
        let token = text.trim();
        if token.chars().count() < MIN_ADMIN_TOKEN_LEN {
            return Err(AdminTokenError::TooShort {
                origin,
                len: token.chars().count(),
            });
        }
        Ok(Some(AdminToken::new(token)))
    }

    /// A token from its text (already trimmed).
    pub fn new(token: &str) -> Self {
        AdminToken {
            digest: Sha256::digest(token.as_bytes()).into(),
        }
    }

    /// Whether `presented` is this token, in constant time.
    fn matches(&self, presented: &[u8]) -> bool {
        let digest: [u8; 32] = Sha256::digest(presented).into();
        self.digest.ct_eq(&digest).into()
    }
}

/// Why an admin request was refused. Each is answered with its own status and code and
/// counted under its label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No `Authorization: Bearer …` header: 401, so a client knows to send one.
    MissingToken,
    /// A bearer token that is not the configured one (or a header that is not a bearer
    /// token): 403.
    WrongToken,
    /// The control plane has no admin token configured, so nobody may change or dump its
    /// state: 403.
    NoTokenConfigured,
}

impl Refusal {
    /// Every refusal, for pre-registering their counters.
    pub const ALL: [Refusal; 3] = [
        Refusal::MissingToken,
        Refusal::WrongToken,
        Refusal::NoTokenConfigured,
    ];

    /// The error code in the JSON answer and the metric label.
    pub fn code(self) -> &'static str {
        match self {
            Refusal::MissingToken => "missing_token",
            Refusal::WrongToken => "wrong_token",
            Refusal::NoTokenConfigured => "admin_token_not_configured",
        }
    }

    /// The HTTP status: 401 asks for credentials, 403 refuses the ones given (or all).
    pub fn status(self) -> u16 {
        match self {
            Refusal::MissingToken => 401,
            Refusal::WrongToken | Refusal::NoTokenConfigured => 403,
        }
    }

    /// What the answer says, for a person reading it.
    pub fn message(self) -> &'static str {
        match self {
            Refusal::MissingToken => {
                "this admin endpoint needs an `Authorization: Bearer <token>` header"
            }
            Refusal::WrongToken => "the bearer token is not this control plane's admin token",
            Refusal::NoTokenConfigured => {
                "no admin token is configured (--admin-token-file or SWITCHYARD_ADMIN_TOKEN), so the admin API is closed"
            }
        }
    }
}

/// Checks an admin request's `Authorization` header (its raw bytes, if present) against the
/// configured token.
///
/// # Errors
/// The [`Refusal`] to answer with.
pub fn authorize(
    configured: Option<&AdminToken>,
    authorization: Option<&[u8]>,
) -> Result<(), Refusal> {
    let Some(token) = configured else {
        return Err(Refusal::NoTokenConfigured);
    };
    let Some(header) = authorization else {
        return Err(Refusal::MissingToken);
    };
    // RFC 6750: the scheme is case-insensitive, one space, then the token.
    let presented = match header.split_at_checked(7) {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case(b"bearer ") => rest,
        _ => return Err(Refusal::WrongToken),
    };
    if token.matches(presented.trim_ascii()) {
        Ok(())
    } else {
        Err(Refusal::WrongToken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "s3cret-admin-token-0123";

    fn header(value: &str) -> Option<&[u8]> {
        Some(value.as_bytes())
    }

    #[test]
    fn the_right_bearer_token_passes_whatever_the_schemes_case() {
        let token = AdminToken::new(TOKEN);
        assert_eq!(
            authorize(Some(&token), header(&format!("Bearer {TOKEN}"))),
            Ok(())
        );
        assert_eq!(
            authorize(Some(&token), header(&format!("bearer {TOKEN}"))),
            Ok(())
        );
        assert_eq!(
            authorize(Some(&token), header(&format!("BEARER {TOKEN} "))),
            Ok(())
        );
    }

    #[test]
    fn a_missing_header_is_401_and_anything_else_403() {
        let token = AdminToken::new(TOKEN);
        assert_eq!(authorize(Some(&token), None), Err(Refusal::MissingToken));
        assert_eq!(Refusal::MissingToken.status(), 401);
        for wrong in [
            "Bearer wrong-token-0123456789".to_string(),
            format!("Bearer {TOKEN}x"),
            format!("Bearer {}", &TOKEN[1..]),
            format!("Basic {TOKEN}"),
            TOKEN.to_string(),
            "Bearer".to_string(),
            "Bearer ".to_string(),
            String::new(),
        ] {
            assert_eq!(
                authorize(Some(&token), header(&wrong)),
                Err(Refusal::WrongToken),
                "{wrong:?}"
            );
        }
        assert_eq!(Refusal::WrongToken.status(), 403);
        // Not valid UTF-8 is just another wrong token.
        assert_eq!(
            authorize(Some(&token), Some(b"Bearer \xff\xfe")),
            Err(Refusal::WrongToken)
        );
    }

    #[test]
    fn without_a_configured_token_the_admin_api_is_closed() {
        assert_eq!(
            authorize(None, header(&format!("Bearer {TOKEN}"))),
            Err(Refusal::NoTokenConfigured)
        );
        assert_eq!(authorize(None, None), Err(Refusal::NoTokenConfigured));
        assert_eq!(Refusal::NoTokenConfigured.status(), 403);
    }

    #[test]
    fn tokens_load_from_a_file_or_the_environment_trimmed_and_long_enough() {
        let dir =
            std::env::temp_dir().join(format!("switchyard-admin-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, format!("{TOKEN}\n")).unwrap();

        let from_file = AdminToken::load(Some(&file), None).unwrap().unwrap();
        assert!(from_file.matches(TOKEN.as_bytes()));
        let from_env = AdminToken::load(None, Some(&format!("  {TOKEN}\n")))
            .unwrap()
            .unwrap();
        assert!(from_env.matches(TOKEN.as_bytes()));
        assert!(AdminToken::load(None, None).unwrap().is_none());

        let err = AdminToken::load(None, Some("short")).unwrap_err();
        assert!(
            matches!(err, AdminTokenError::TooShort { len: 5, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("SWITCHYARD_ADMIN_TOKEN"), "{err}");
        std::fs::write(&file, "  \n").unwrap();
        let err = AdminToken::load(Some(&file), None).unwrap_err();
        assert!(err.to_string().contains("--admin-token-file"), "{err}");
        let err = AdminToken::load(Some(&dir.join("absent")), None).unwrap_err();
        assert!(matches!(err, AdminTokenError::Read { .. }), "{err}");
        let err = AdminToken::load(Some(&file), Some(TOKEN)).unwrap_err();
        assert!(matches!(err, AdminTokenError::Conflict), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn debug_output_shows_no_token() {
        let shown = format!("{:?}", AdminToken::new(TOKEN));
        assert!(!shown.contains(TOKEN), "{shown}");
    }
}
