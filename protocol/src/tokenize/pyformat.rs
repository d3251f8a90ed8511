//! Printing values the way Jinja2 does: `{{ x }}` is Python's `str(x)`.
//!
//! minijinja prints `none`, `true`, `[1, "a"]`; Jinja2 prints `None`, `True`, `[1, 'a']`. A
//! template that prints a `null` tool description or a boolean kwarg would otherwise differ
//! from vLLM by a few tokens. The engine's `~` operator still uses minijinja's own spelling
//! (it cannot be hooked); `{{ }}` output and the `string` and `join` filters use this one.

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, Output, State, Value};

use super::pyjson::py_float_repr;

/// The environment's formatter: undefined prints nothing, everything else as `str(x)`.
pub(crate) fn python_formatter(
    out: &mut Output<'_>,
    _state: &State<'_, '_>,
    value: &Value,
) -> Result<(), Error> {
    if value.is_undefined() {
        return Ok(());
    }
    let written = match value.as_str() {
        Some(s) => out.write_str(s),
        None => out.write_str(&py_str(value)),
    };
    written.map_err(|_| {
        Error::new(
            minijinja::ErrorKind::WriteFailure,
            "cannot write template output",
        )
    })
}

/// The `string` filter: Python's `str(x)`.
pub(crate) fn string_filter(value: &Value) -> Value {
    if value.as_str().is_some() {
        value.clone()
    } else {
        Value::from(py_str(value))
    }
}

/// The `join` filter, Jinja2's `join(value, d='', attribute=None)`: items printed with
/// Python's `str()`.
pub(crate) fn join_filter(
    value: &Value,
    d: Option<String>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let separator = match kwargs.get::<Option<String>>("d")? {
        Some(d) => d,
        None => d.unwrap_or_default(),
    };
    let attribute: Option<String> = kwargs.get("attribute")?;
    kwargs.assert_all_used()?;
    if value.is_undefined() || value.is_none() {
        return Ok(Value::from(""));
    }
    if let Some(s) = value.as_str() {
        let chars: Vec<String> = s.chars().map(String::from).collect();
        return Ok(Value::from(chars.join(&separator)));
    }
    let mut parts = Vec::new();
    for item in value.try_iter()? {
        let item = match &attribute {
            Some(path) => path
                .split('.')
                .try_fold(item, |v, key| match key.parse::<i64>() {
                    Ok(index) => v.get_item(&Value::from(index)),
                    Err(_) => v.get_attr(key),
                })?,
            None => item,
        };
        parts.push(py_str(&item));
    }
    Ok(Value::from(parts.join(&separator)))
}

/// Python's `str(x)` for template values.
pub(crate) fn py_str(value: &Value) -> String {
    match value.as_str() {
        Some(s) => s.to_string(),
        None => py_repr(value),
    }
}

/// Python's `repr(x)` for template values.
pub(crate) fn py_repr(value: &Value) -> String {
    match value.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::None => "None".into(),
        ValueKind::Bool => (if value.is_true() { "True" } else { "False" }).into(),
        ValueKind::Number if value.is_integer() => value.to_string(),
        ValueKind::Number => f64::try_from(value.clone())
            .map_or_else(|_| value.to_string(), |f| py_float_repr(f, false)),
        ValueKind::String => quote(value.as_str().unwrap_or_default()),
        ValueKind::Seq => match value.try_iter() {
            Ok(items) => format!(
                "[{}]",
                items.map(|v| py_repr(&v)).collect::<Vec<_>>().join(", ")
            ),
            Err(_) => value.to_string(),
        },
        ValueKind::Map => match value.try_iter() {
            Ok(keys) => {
                let pairs: Vec<String> = keys
                    .map(|k| {
                        format!(
                            "{}: {}",
                            py_repr(&k),
                            py_repr(&value.get_item(&k).unwrap_or_default())
                        )
                    })
                    .collect();
                format!("{{{}}}", pairs.join(", "))
            }
            Err(_) => value.to_string(),
        },
        _ => value.to_string(),
    }
}

/// Python's string repr: single quotes unless the text has a `'` and no `"`.
fn quote(s: &str) -> String {
    let q = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push(q);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenize::ordered::json_to_value;

    #[test]
    fn prints_like_python_str() {
        let v = json_to_value(&serde_json::json!({"b": [1, 2.5, null, true, "it's"], "a": "x\ny"}));
        assert_eq!(
            py_str(&v),
            r#"{'b': [1, 2.5, None, True, "it's"], 'a': 'x\ny'}"#
        );
        assert_eq!(py_str(&Value::from(false)), "False");
        assert_eq!(py_str(&Value::from(1e16)), "1e+16");
        assert_eq!(py_str(&Value::from("plain")), "plain");
        assert_eq!(quote("a'b\"c"), r#"'a\'b"c'"#);
    }

    #[test]
    fn join_prints_items_like_python() {
        let mut env = minijinja::Environment::new();
        env.add_filter("join", join_filter);
        let render = |src: &str| env.render_str(src, minijinja::context! {}).unwrap();
        assert_eq!(
            render("{{ [1, none, true, 'a'] | join(', ') }}"),
            "1, None, True, a"
        );
        assert_eq!(render("{{ 'abc' | join('-') }}"), "a-b-c");
        assert_eq!(
            render("{{ [{'n': {'m': 1}}, {'n': {'m': 2}}] | join(d='+', attribute='n.m') }}"),
            "1+2"
        );
    }
}
