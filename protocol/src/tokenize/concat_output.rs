//! Output tags that build a string with `+` become one output tag per operand.
//!
//! Chat templates print each message as `{{- '<|im_start|>' + message.role + '\n' +
//! message.content + '<|im_end|>' + '\n' }}`. minijinja evaluates that as Jinja does, left to
//! right, so every `+` allocates a new string and copies everything before it: a 100 KB
//! message is copied four times before it is printed, and at 128k-token prompts those copies
//! were a third of the render (docs/performance.md). Printing the operands one after another
//! writes the same text once.
//!
//! **Same output.** The rewrite applies only when the first operand is a string literal and
//! the expression's top level holds nothing but `+` between operands (filters, attribute and
//! item access, calls and anything in brackets are part of an operand). In Jinja a string plus
//! anything but a string raises, so the original renders without error only when every
//! operand is a string, and then its output is the operands' text in order: exactly what the
//! split tags print. Where the original would raise (a non-string operand), the engine rejects
//! the request anyway; the route for it does not matter. Anything else (`~`, `-`, `if`/`else`,
//! `and`/`or`, comparisons, a first operand that is not a literal) is left as written.

/// `source` with every qualifying `{{ 'lit' + a + b }}` split into `{{ 'lit' }}{{ a }}{{ b }}`
/// (whitespace-control markers kept on the outer ends). Comments, statement tags and raw
/// blocks are copied unchanged.
pub(crate) fn split_concatenated_output(source: &str) -> String {
    let mut out = String::with_capacity(source.len() + source.len() / 8);
    let bytes = source.as_bytes();
    let mut copied = 0; // source[..copied] is in `out`
    let mut i = 0;
    while i + 1 < bytes.len() {
        if bytes[i] != b'{' {
            i += 1;
            continue;
        }
        match bytes[i + 1] {
            b'#' => {
                i = source[i..]
                    .find("#}")
                    .map_or(bytes.len(), |end| i + end + 2)
            }
            b'%' => {
                // An unterminated tag is minijinja's to report; nothing after it is split.
                let Some(end) = tag_end(source, i + 2, b'%') else {
                    break;
                };
                let inner = source[i + 2..end - 2].trim_matches(['-', '+']);
                i = end;
                if inner.trim() == "raw" {
                    // Nothing in a raw block is a tag; skip to its end tag.
                    i = find_endraw(source, i).unwrap_or(bytes.len());
                }
            }
            b'{' => {
                let Some(end) = tag_end(source, i + 2, b'}') else {
                    break;
                };
                if let Some(split) = split_tag(&source[i..end]) {
                    out.push_str(&source[copied..i]);
                    out.push_str(&split);
                    copied = end;
                }
                i = end;
            }
            _ => i += 1,
        }
    }
    out.push_str(&source[copied..]);
    out
}

/// The index just past the `X}` closing a tag whose body starts at `from` (`X` is `%` or
/// `}`), skipping string literals.
fn tag_end(source: &str, from: usize, close: u8) -> Option<usize> {
    let bytes = source.as_bytes();
    let mut i = from;
    while i + 1 < bytes.len() {
        match bytes[i] {
            b'\'' | b'"' => i = string_end(bytes, i)?,
            c if c == close && bytes[i + 1] == b'}' => return Some(i + 2),
            _ => i += 1,
        }
    }
    None
}

/// The index just past the string literal opening at `start`.
fn string_end(bytes: &[u8], start: usize) -> Option<usize> {
    let quote = bytes[start];
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            c if c == quote => return Some(i + 1),
            _ => i += 1,
        }
    }
    None
}

/// The index just past the `{% endraw %}` tag at or after `from`.
fn find_endraw(source: &str, from: usize) -> Option<usize> {
    let mut at = from;
    while let Some(pos) = source[at..].find("{%") {
        let start = at + pos;
        let end = tag_end(source, start + 2, b'%')?;
        if source[start + 2..end - 2].trim_matches(['-', '+']).trim() == "endraw" {
            return Some(end);
        }
        at = end;
    }
    None
}

/// `tag` (a whole `{{ ... }}`) split into one output tag per `+` operand, if it qualifies.
fn split_tag(tag: &str) -> Option<String> {
    let inner = &tag[2..tag.len() - 2];
    let (open, inner) = match inner.as_bytes().first() {
        Some(b'-' | b'+') => inner.split_at(1),
        _ => ("", inner),
    };
    let (expr, close) = match inner.as_bytes().last() {
        Some(b'-' | b'+') => inner.split_at(inner.len() - 1),
        _ => (inner, ""),
    };
    let operands = top_level_operands(expr)?;
    if operands.len() < 2 || !is_one_string_literal(operands[0]) {
        return None;
    }
    let mut split = String::with_capacity(tag.len() + 8 * operands.len());
    for (k, operand) in operands.iter().enumerate() {
        let first = if k == 0 { open } else { "" };
        let last = if k + 1 == operands.len() { close } else { "" };
        split.push_str(&format!("{{{{{first} {} {last}}}}}", operand.trim()));
    }
    Some(split)
}

/// The operands of `expr` if its top level is only operands joined by `+`; `None` if anything
/// else is there (another operator, a keyword, unbalanced brackets, an empty operand).
fn top_level_operands(expr: &str) -> Option<Vec<&str>> {
    let bytes = expr.as_bytes();
    let mut operands = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        match c {
            b'\'' | b'"' => {
                i = string_end(bytes, i)?;
                continue;
            }
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth = depth.checked_sub(1)?,
            _ if depth > 0 => {}
            b'+' => {
                operands.push(&expr[start..i]);
                start = i + 1;
            }
            b'~' | b'-' | b'*' | b'/' | b'%' | b'<' | b'>' | b'=' | b'!' => return None,
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let word_end = expr[i..]
                    .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
                    .map_or(bytes.len(), |n| i + n);
                if matches!(
                    &expr[i..word_end],
                    "if" | "else" | "and" | "or" | "not" | "in" | "is"
                ) {
                    return None;
                }
                i = word_end;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    if depth != 0 {
        return None;
    }
    operands.push(&expr[start..]);
    operands
        .iter()
        .all(|o| !o.trim().is_empty())
        .then_some(operands)
}

/// Whether `operand` is exactly one quoted string literal.
fn is_one_string_literal(operand: &str) -> bool {
    let t = operand.trim().as_bytes();
    matches!(t.first(), Some(b'\'' | b'"')) && string_end(t, 0) == Some(t.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenize::template::ChatTemplate;
    use minijinja::context;
    use proptest::prelude::*;

    #[test]
    fn a_message_line_is_split_and_its_markers_kept() {
        let src = "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>' + '\\n' }}{% endfor %}";
        assert_eq!(
            split_concatenated_output(src),
            "{%- for m in messages %}{{- '<|im_start|>' }}{{ m.role }}{{ '\\n' }}{{ m.content }}{{ '<|im_end|>' }}{{ '\\n' }}{% endfor %}"
        );
        assert_eq!(
            split_concatenated_output("{{ 'a' + b -}}"),
            "{{ 'a' }}{{ b -}}"
        );
    }

    #[test]
    fn anything_but_a_plain_concatenation_is_left_alone() {
        for src in [
            "{{ a + 'x' }}",             // first operand not a literal: may be numbers
            "{{ 'a' + b if c else d }}", // the conditional binds looser than +
            "{{ 'a' + b ~ c }}",         // another operator
            "{{ 'a' + b - 1 }}",
            "{{ 'a' + (b) | upper + c == d }}",
            "{{ 'a' + b and c }}",
            "{{ 'a' }}",               // nothing to split
            "{{ ('a' + b) | upper }}", // the + is inside brackets
            "{{ 'a' + }}",             // empty operand
            "{{ 'a' 'b' + c }}",       // not one literal
            "{# {{ 'a' + b }} #}",     // a comment
            "{% raw %}{{ 'a' + b }}{% endraw %}",
            "{% set s = '{{ \\'a\\' + b }}' %}", // a string in a statement
            "{% if x 中",                        // unterminated: left for minijinja to report
            "{{ 'a' + b 中",
        ] {
            assert_eq!(split_concatenated_output(src), src, "{src}");
        }
    }

    #[test]
    fn brackets_calls_filters_and_strings_stay_inside_their_operand() {
        assert_eq!(
            split_concatenated_output("{{ '}}+' + m['a+b'] + f(x, 'y+z') + s | trim }}"),
            "{{ '}}+' }}{{ m['a+b'] }}{{ f(x, 'y+z') }}{{ s | trim }}"
        );
    }

    fn render(src: &str, role: &str, content: &str, extra: &str) -> Result<String, String> {
        let t = ChatTemplate::compile_unsplit(src).map_err(|e| e.to_string())?;
        t.render(context! { messages => vec![
            context! { role => role, content => content },
            context! { role => "assistant", content => extra },
        ]})
        .map_err(|e| e.to_string())
    }

    proptest! {
        #[test]
        fn the_split_template_renders_what_the_original_renders(
            role in "[a-z]{0,8}",
            content in "(\\PC|\\n){0,40}",
            extra in "(\\PC|\\n){0,20}",
        ) {
            let original = "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content.strip() + '<|im_end|>' + '\\n' }}\n{%- if loop.last %}{{ '[' + m.content | upper + ']' -}}\n  {% endif %}{% endfor %}";
            let split = split_concatenated_output(original);
            prop_assert_ne!(&split, original);
            prop_assert_eq!(
                render(original, &role, &content, &extra),
                render(&split, &role, &content, &extra)
            );
        }
    }
}
