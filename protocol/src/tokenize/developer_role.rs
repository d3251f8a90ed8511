//! `developer` messages for templates that do not know the role, as vLLM's
//! `safe_apply_chat_template` (`vllm/renderers/hf.py`) rewrites them.
//!
//! A template that never names `developer` (Qwen3's, for one) would drop such messages or
//! mis-render them, so vLLM turns each into a `system` message (without its `tools`) and then
//! merges the system messages into one at the front whenever one is not first or there are
//! several: many templates only render a system message in first place.

use std::borrow::Cow;
use std::sync::Arc;

use serde_json::Value as Json;

use super::chat_messages::MessageEntries;

/// What separates the merged system messages' contents.
const SYSTEM_JOINER: &str = "\n\n";

/// The conversation with developer messages made system messages and the system messages
/// merged when needed; unchanged if it has no developer message.
pub(crate) fn developer_as_system(messages: Vec<MessageEntries<'_>>) -> Vec<MessageEntries<'_>> {
    if !messages.iter().any(|m| role_of(m) == Some("developer")) {
        return messages;
    }
    let converted = messages
        .into_iter()
        .map(|mut message| {
            if role_of(&message) == Some("developer") {
                set_role(&mut message, "system");
                message.retain(|(key, _)| &**key != "tools");
            }
            message
        })
        .collect();
    consolidate_system_messages(converted)
}

/// vLLM's `_consolidate_system_messages`: when a system message is not the first message or
/// follows another system message, every system message is replaced by one at position 0
/// holding only `role` and `content`, the non-empty contents joined with a blank line (so it
/// can be empty). Otherwise the conversation is left as it is.
fn consolidate_system_messages(messages: Vec<MessageEntries<'_>>) -> Vec<MessageEntries<'_>> {
    let system_at = |i: usize| role_of(&messages[i]) == Some("system");
    let needs_merge = (1..messages.len()).any(system_at);
    if !needs_merge {
        return messages;
    }
    let mut contents: Vec<String> = Vec::new();
    let mut others = Vec::with_capacity(messages.len());
    for message in messages {
        if role_of(&message) == Some("system") {
            // Prepared content is always a string ("string" content format).
            if let Some(text) = content_of(&message).filter(|text| !text.is_empty()) {
                contents.push(text.to_owned());
            }
        } else {
            others.push(message);
        }
    }
    let merged: MessageEntries<'_> = vec![
        (Arc::from("role"), Some(Cow::Owned(Json::from("system")))),
        (
            Arc::from("content"),
            Some(Cow::Owned(Json::from(contents.join(SYSTEM_JOINER)))),
        ),
    ];
    std::iter::once(merged).chain(others).collect()
}

fn entry<'m>(message: &'m MessageEntries<'_>, key: &str) -> Option<&'m Json> {
    message
        .iter()
        .find(|(k, _)| &**k == key)
        .and_then(|(_, value)| value.as_deref())
}

fn role_of<'m>(message: &'m MessageEntries<'_>) -> Option<&'m str> {
    entry(message, "role").and_then(Json::as_str)
}

fn content_of<'m>(message: &'m MessageEntries<'_>) -> Option<&'m str> {
    entry(message, "content").and_then(Json::as_str)
}

fn set_role(message: &mut MessageEntries<'_>, role: &str) {
    if let Some((_, value)) = message.iter_mut().find(|(k, _)| &**k == "role") {
        *value = Some(Cow::Owned(Json::from(role)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(role: &str, content: &str) -> MessageEntries<'static> {
        vec![
            (Arc::from("role"), Some(Cow::Owned(Json::from(role)))),
            (Arc::from("content"), Some(Cow::Owned(Json::from(content)))),
        ]
    }

    fn summary(messages: &[MessageEntries<'_>]) -> Vec<(String, String)> {
        messages
            .iter()
            .map(|m| {
                (
                    role_of(m).unwrap_or_default().to_owned(),
                    content_of(m).unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }

    fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
        expected
            .iter()
            .map(|(r, c)| ((*r).to_owned(), (*c).to_owned()))
            .collect()
    }

    #[test]
    fn without_developer_messages_nothing_moves() {
        // A lone system message in second place stays there: vLLM only consolidates when it
        // converted a developer message.
        let chat = vec![message("user", "a"), message("system", "s")];
        assert_eq!(
            summary(&developer_as_system(chat)),
            pairs(&[("user", "a"), ("system", "s")])
        );
    }

    #[test]
    fn a_single_leading_developer_message_becomes_system_in_place() {
        let mut developer = message("developer", "");
        developer.push((Arc::from("name"), Some(Cow::Owned(Json::from("ops")))));
        developer.push((Arc::from("tools"), None));
        let out = developer_as_system(vec![developer, message("user", "a")]);
        assert_eq!(summary(&out), pairs(&[("system", ""), ("user", "a")]));
        // Not merged, so it keeps `name`; `tools` goes.
        let keys: Vec<&str> = out[0].iter().map(|(k, _)| &**k).collect();
        assert_eq!(keys, ["role", "content", "name"]);
    }

    #[test]
    fn system_messages_merge_at_the_front_skipping_empty_ones() {
        let chat = vec![
            message("system", "s1"),
            message("user", "a"),
            message("developer", ""),
            message("developer", "d1"),
            message("user", "b"),
        ];
        assert_eq!(
            summary(&developer_as_system(chat)),
            pairs(&[("system", "s1\n\nd1"), ("user", "a"), ("user", "b")])
        );
        // A lone developer message after the first place moves to the front.
        let chat = vec![message("user", "a"), message("developer", "d")];
        assert_eq!(
            summary(&developer_as_system(chat)),
            pairs(&[("system", "d"), ("user", "a")])
        );
    }
}
