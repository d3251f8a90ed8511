//! The chat template, compiled once into a minijinja environment that behaves like the Jinja
//! environment HF transformers (and so vLLM) renders with.
//!
//! transformers: `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
//! extensions=[AssistantTracker, loopcontrols])`, its own `tojson`, globals `raise_exception`
//! and `strftime_now`. minijinja with `minijinja-contrib`'s pycompat supplies the Python string
//! and dict methods templates call (`.strip()`, `.split()`, `.items()`, ...), and `pyformat`
//! prints values as Python's `str()` does (`None`, `True`).

use minijinja::{Environment, Error, ErrorKind, Value};

use super::concat_output::split_concatenated_output;
use super::error::TokenizeError;
use super::{pyformat, pyjson, strftime};

/// Name the template is stored under; it has no `.html` suffix, so output is never
/// HTML-escaped.
const TEMPLATE_NAME: &str = "chat_template";

/// Marks errors raised by the template's `raise_exception`, which means the template refused
/// the conversation (the client's fault), not that rendering broke.
const RAISED_PREFIX: &str = "raise_exception: ";

/// A compiled chat template.
pub(crate) struct ChatTemplate {
    env: Environment<'static>,
    /// Whether the source names the `developer` role as a quoted string literal: vLLM's test
    /// for templates that render developer messages themselves (the others get them as
    /// system messages, see `developer_role`).
    knows_developer_role: bool,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`.
    ///
    /// # Errors
    /// [`TokenizeError::Template`] if minijinja cannot parse it.
    pub(crate) fn compile(source: &str) -> Result<Self, TokenizeError> {
        Self::compile_exactly(
            split_concatenated_output(&strip_generation_tags(source)),
            names_developer_role(source),
        )
    }

    /// Compiles `source` without splitting its concatenating output tags: what the split is
    /// tested against.
    #[cfg(test)]
    pub(crate) fn compile_unsplit(source: &str) -> Result<Self, TokenizeError> {
        Self::compile_exactly(strip_generation_tags(source), names_developer_role(source))
    }

    fn compile_exactly(source: String, knows_developer_role: bool) -> Result<Self, TokenizeError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(pyformat::python_formatter);
        env.add_filter("tojson", pyjson::tojson_filter);
        env.add_filter("string", pyformat::string_filter);
        env.add_filter("join", pyformat::join_filter);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(TEMPLATE_NAME, source)
            .map_err(|e| TokenizeError::Template(format!("cannot compile: {e:#}")))?;
        Ok(ChatTemplate {
            env,
            knows_developer_role,
        })
    }

    /// Whether the template handles `developer` messages itself (vLLM's
    /// `_detect_developer_role_support`: the source holds `"developer"` or `'developer'`).
    pub(crate) fn knows_developer_role(&self) -> bool {
        self.knows_developer_role
    }

    /// Renders the template with `context` (a map value).
    ///
    /// # Errors
    /// [`TokenizeError::InvalidRequest`] (field `messages`) when the template calls
    /// `raise_exception`, [`TokenizeError::Template`] for any other render failure.
    pub(crate) fn render(&self, context: Value) -> Result<String, TokenizeError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| TokenizeError::Template(e.to_string()))?;
        template.render(context).map_err(|e| match e.detail() {
            Some(detail) if detail.starts_with(RAISED_PREFIX) => TokenizeError::invalid(
                "messages",
                format!(
                    "the chat template rejected the conversation: {}",
                    &detail[RAISED_PREFIX.len()..]
                ),
            ),
            // Without the alternate form's template excerpt: this text is the route call's
            // answer, and a request whose data the template cannot take (a number where it
            // expects text) got ~1.7 KB of template source back.
            _ => TokenizeError::Template(format!("cannot render: {e}")),
        })
    }
}

/// vLLM's test is textual, not semantic: a quoted `developer` anywhere counts, even in a
/// comment, and a role compared some other way does not.
fn names_developer_role(source: &str) -> bool {
    source.contains("\"developer\"") || source.contains("'developer'")
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISED_PREFIX}{message}"),
    ))
}

fn strftime_now(format: String) -> Value {
    // The wall clock is what the template asks for (today's date in the system prompt); vLLM
    // reads it the same way, so the rendered prompt depends on the day either way.
    #[allow(clippy::disallowed_methods)]
    let now = std::time::SystemTime::now();
    let secs = now
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    Value::from(strftime::format_utc(secs, &format))
}

/// transformers' `{% generation %}...{% endgeneration %}` tag only marks assistant spans for
/// training masks and renders its body unchanged. minijinja does not know it, so each tag
/// becomes an equivalent no-op block (`{% if true %}` / `{% endif %}`) that keeps the tag's
/// whitespace-control markers, so trim_blocks / lstrip_blocks act exactly as before.
fn strip_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (open, body) = split_marker_front(inner);
        let (body, close) = split_marker_back(body);
        let replacement = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => out.push_str(&format!("{{%{open} {r} {close}%}}")),
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

fn split_marker_front(s: &str) -> (&str, &str) {
    match s.chars().next() {
        Some(c @ ('-' | '+')) => s.split_at(c.len_utf8()),
        _ => ("", s),
    }
}

fn split_marker_back(s: &str) -> (&str, &str) {
    match s.chars().last() {
        Some(c @ ('-' | '+')) => s.split_at(s.len() - c.len_utf8()),
        _ => (s, ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use minijinja::context;

    #[test]
    fn python_flavoured_template_features_render() {
        let t = ChatTemplate::compile(
            "{%- for m in messages[::-1] %}{{ m.content.strip() | upper }}{% if loop.index0 == 0 %}{% continue %}{% endif %}|{% endfor %}\n\
             {{- {'a': [1.5, none, true], 'b': 1} | tojson(indent=2) }}\n\
             {%- if flag is false %}F{% endif %}",
        )
        .unwrap();
        let out = t
            .render(context! { messages => vec![context!{content => " x "}, context!{content => "y"}], flag => false })
            .unwrap();
        // Expected output from Jinja2 with transformers' environment. (The dict literal is
        // written sorted: minijinja sorts literal maps; request data keeps its own order.)
        assert_eq!(
            out,
            "YX|{\n  \"a\": [\n    1.5,\n    null,\n    true\n  ],\n  \"b\": 1\n}F"
        );
    }

    #[test]
    fn raise_exception_is_the_requests_fault() {
        let t = ChatTemplate::compile("{{ raise_exception('roles must alternate') }}").unwrap();
        let err = t.render(context! {}).unwrap_err();
        assert!(err.is_client_error(), "{err}");
        assert!(err.to_string().contains("roles must alternate"));
    }

    /// Any other failure is no proof the request is at fault (the template engine may lack
    /// something the engine's Jinja has): the route call fails open, and its answer names the
    /// failure in a line, without the template's source.
    #[test]
    fn a_render_failure_fails_open_and_is_said_in_a_line() {
        let t = ChatTemplate::compile("line one\n{{ m.strip() }}\nline three").unwrap();
        let err = t.render(context! { m => 123 }).unwrap_err();
        assert!(!err.is_client_error(), "{err}");
        let text = err.to_string();
        assert!(text.contains("strip"), "{text}");
        assert!(
            !text.contains("line three"),
            "the template's source: {text}"
        );
    }

    #[test]
    fn generation_tags_render_their_body() {
        let src = "{%- for m in messages %}\n  {%- generation %}\n{{ m }}\n  {%- endgeneration %}\n{% endfor %}";
        let t = ChatTemplate::compile(src).unwrap();
        // Jinja2 with transformers' AssistantTracker renders "ab".
        assert_eq!(
            t.render(context! { messages => vec!["a", "b"] }).unwrap(),
            "ab"
        );
        assert!(strip_generation_tags("{% generation -%}").contains("{% if true -%}"));
    }
}
