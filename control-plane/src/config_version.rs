//! The router config's version as HTTP sees it: an `ETag` on `GET` and `PUT /v1/config`,
//! and the `If-Match` precondition a `PUT` may carry, so that two operators (or two scripts)
//! editing the config do not silently undo each other's change.
//!
//! The version is the shared config's revision in the replicas' NATS KV bucket with
//! `--replica-id`, and otherwise a count of this process's changes (0 at start). Entity tags
//! are strong (`"7"`): `If-Match` compares strongly (RFC 9110 §13.1.1), so a weak tag
//! (`W/"7"`) never matches.

use crate::config::ConfigError;

/// An `If-Match` header's condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IfMatch {
    /// `*`: any current config.
    Any,
    /// A list of entity tags; the versions among them (tags that name no version of ours,
    /// weak ones included, match nothing).
    Versions(Vec<u64>),
}

impl IfMatch {
    /// The condition of an `If-Match` header value; `None` for an empty one.
    pub fn parse(header: &str) -> Option<IfMatch> {
        let header = header.trim();
        if header.is_empty() {
            return None;
        }
        if header == "*" {
            return Some(IfMatch::Any);
        }
        let versions = header
            .split(',')
            .filter_map(|tag| {
                tag.trim()
                    .strip_prefix('"')?
                    .strip_suffix('"')?
                    .parse()
                    .ok()
            })
            .collect();
        Some(IfMatch::Versions(versions))
    }

    /// Whether a config at `version` meets the condition.
    pub fn admits(&self, version: u64) -> bool {
        match self {
            IfMatch::Any => true,
            IfMatch::Versions(versions) => versions.contains(&version),
        }
    }
}

/// The `ETag` value of a config version.
pub fn etag(version: u64) -> String {
    format!("\"{version}\"")
}

/// Why a config change was not made (the config is unchanged).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PatchRefusal {
    /// A field is unknown, mistyped or out of range.
    #[error(transparent)]
    Invalid(#[from] ConfigError),
    /// `If-Match` named another version than the current one.
    #[error("the config is at version {current} (ETag {}), not the one If-Match names: read it again (GET /v1/config) and make the change on that", etag(*current))]
    Stale {
        /// The current version.
        current: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn if_match_takes_star_strong_tags_and_nothing_else() {
        assert_eq!(IfMatch::parse(""), None);
        assert!(IfMatch::parse("*").unwrap().admits(41));
        let listed = IfMatch::parse(r#""3", "7""#).unwrap();
        assert!(listed.admits(7) && listed.admits(3) && !listed.admits(4));
        // Weak tags, unquoted numbers and other servers' tags match no version.
        for never in [r#"W/"7""#, "7", r#""abc""#, r#""-1""#] {
            let condition = IfMatch::parse(never).unwrap();
            assert!(!condition.admits(7), "{never}");
            assert!(!condition.admits(0), "{never}");
        }
        assert_eq!(etag(7), r#""7""#);
    }
}
