//! Python's `json.dumps` for template values: HF transformers' `tojson` filter.
//!
//! transformers replaces Jinja's `tojson` with `json.dumps(x, ensure_ascii=False, indent=None,
//! separators=None, sort_keys=False)`: insertion key order, `", "` and `": "` separators, no
//! HTML escaping, Python's float repr. minijinja's built-in `tojson` is compact and escapes
//! HTML, so every tool definition would tokenize differently from vLLM without this filter.

use minijinja::value::{Kwargs, Rest, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// Options of `json.dumps` that chat templates use.
#[derive(Debug, Clone)]
pub(crate) struct DumpOptions {
    /// Escape non-ASCII as `\uXXXX` (HF's default is false).
    pub ensure_ascii: bool,
    /// Pretty-print with this indent per level (`indent=` as a string of spaces or a string).
    pub indent: Option<String>,
    /// Between items.
    pub item_separator: String,
    /// Between a key and its value.
    pub key_separator: String,
    /// Sort object keys.
    pub sort_keys: bool,
}

impl Default for DumpOptions {
    fn default() -> Self {
        DumpOptions {
            ensure_ascii: false,
            indent: None,
            item_separator: ", ".into(),
            key_separator: ": ".into(),
            sort_keys: false,
        }
    }
}

/// The `tojson` filter: `value | tojson(ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`, positional arguments in that order as in HF's Python signature.
pub(crate) fn tojson_filter(
    value: &Value,
    args: Rest<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > NAMES.len() {
        return Err(Error::new(
            ErrorKind::TooManyArguments,
            "tojson takes at most 4 arguments",
        ));
    }
    let mut slots: [Option<Value>; 4] = Default::default();
    for (slot, arg) in slots.iter_mut().zip(args.iter()) {
        *slot = Some(arg.clone());
    }
    for (slot, name) in slots.iter_mut().zip(NAMES) {
        if let Some(v) = kwargs.get::<Option<Value>>(name)? {
            *slot = Some(v);
        }
    }
    kwargs.assert_all_used()?;
    let [ensure_ascii, indent, separators, sort_keys] = slots;
    let mut opts = DumpOptions {
        ensure_ascii: ensure_ascii.is_some_and(|v| v.is_true()),
        sort_keys: sort_keys.is_some_and(|v| v.is_true()),
        ..DumpOptions::default()
    };
    if let Some(indent) = indent.filter(|v| !v.is_none() && !v.is_undefined()) {
        opts.indent = Some(match indent.as_str() {
            Some(s) => s.to_string(),
            None => {
                let n = i64::try_from(indent.clone()).map_err(|_| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson indent must be an int or str",
                    )
                })?;
                " ".repeat(n.max(0) as usize)
            }
        });
        // Python switches the item separator to "," when indenting.
        opts.item_separator = ",".into();
    }
    if let Some(seps) = separators.filter(|v| !v.is_none() && !v.is_undefined()) {
        let parts: Vec<Value> = seps
            .try_iter()
            .map_err(|_| {
                Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson separators must be a pair",
                )
            })?
            .collect();
        match parts.as_slice() {
            [item, key] if item.as_str().is_some() && key.as_str().is_some() => {
                opts.item_separator = item.as_str().unwrap_or_default().to_string();
                opts.key_separator = key.as_str().unwrap_or_default().to_string();
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson separators must be two strings",
                ))
            }
        }
    }
    let mut out = String::new();
    dump(value, &opts, 0, &mut out)?;
    Ok(Value::from(out))
}

/// Serialises `value` as Python's `json.dumps` would.
pub(crate) fn dump(
    value: &Value,
    opts: &DumpOptions,
    depth: usize,
    out: &mut String,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if value.is_integer() {
                out.push_str(&value.to_string());
            } else {
                let f = f64::try_from(value.clone())?;
                out.push_str(&py_float_repr(f, true));
            }
        }
        ValueKind::String => {
            write_string(value.as_str().unwrap_or_default(), opts.ensure_ascii, out)
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, opts, depth, '[', ']', &items, |item, out| {
                dump(item, opts, depth + 1, out)
            })?;
        }
        ValueKind::Map => {
            let mut pairs: Vec<(String, Value)> = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                pairs.push((key_string(&key)?, item));
            }
            if opts.sort_keys {
                pairs.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(out, opts, depth, '{', '}', &pairs, |(key, item), out| {
                write_string(key, opts.ensure_ascii, out);
                out.push_str(&opts.key_separator);
                dump(item, opts, depth + 1, out)
            })?;
        }
        other => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("Object of kind {other} is not JSON serializable"),
            ))
        }
    }
    Ok(())
}

fn write_container<T>(
    out: &mut String,
    opts: &DumpOptions,
    depth: usize,
    open: char,
    close: char,
    items: &[T],
    mut write_item: impl FnMut(&T, &mut String) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&opts.item_separator);
        }
        if let Some(indent) = &opts.indent {
            out.push('\n');
            out.push_str(&indent.repeat(depth + 1));
        }
        write_item(item, out)?;
    }
    if let Some(indent) = &opts.indent {
        out.push('\n');
        out.push_str(&indent.repeat(depth));
    }
    out.push(close);
    Ok(())
}

/// Python turns non-string keys into strings: `True` -> "true", `None` -> "null", numbers by repr.
fn key_string(key: &Value) -> Result<String, Error> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_string(),
        ValueKind::None => "null".into(),
        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).into(),
        ValueKind::Number if key.is_integer() => key.to_string(),
        ValueKind::Number => py_float_repr(f64::try_from(key.clone())?, true),
        other => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("keys must be str, int, float, bool or None, not {other}"),
            ))
        }
    })
}

/// A JSON string literal the way Python's encoder writes it.
fn write_string(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => push_u_escape(c as u32, out),
            c if ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    push_u_escape(u32::from(*unit), out);
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn push_u_escape(unit: u32, out: &mut String) {
    out.push_str(&format!("\\u{unit:04x}"));
}

/// Python's `repr(float)` (and `json.dumps` of a float): shortest round-trip digits, fixed
/// notation for decimal exponents in [-4, 16), scientific with a signed two-digit exponent
/// otherwise, and always a `.0` on integral values.
pub(crate) fn py_float_repr(f: f64, json: bool) -> String {
    if f.is_nan() {
        return if json { "NaN" } else { "nan" }.into();
    }
    if f.is_infinite() {
        let s = if json { "Infinity" } else { "inf" };
        return if f > 0.0 { s.into() } else { format!("-{s}") };
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // `{:e}` gives the shortest digits that round-trip, e.g. "-1.2345e-5".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let body = if (-4..16).contains(&exp) {
        if exp >= 0 {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                format!("{digits}{}.0", "0".repeat(int_len - digits.len()))
            } else {
                format!("{}.{}", &digits[..int_len], &digits[int_len..])
            }
        } else {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let exp_sign = if exp < 0 { '-' } else { '+' };
        format!("{first}{frac}e{exp_sign}{:02}", exp.abs())
    };
    format!("{sign}{body}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456789.125, "123456789.125"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (1.2345678901234568e17, "1.2345678901234568e+17"),
            (3.0e100, "3e+100"),
            (-0.0, "-0.0"),
            (f64::INFINITY, "Infinity"),
        ];
        for (f, want) in cases {
            assert_eq!(py_float_repr(f, true), want, "{f:e}");
        }
    }

    #[test]
    fn strings_escape_like_python() {
        let mut out = String::new();
        write_string("a\"b\\c\n\t\u{1}é😀</s>&", false, &mut out);
        assert_eq!(out, r#""a\"b\\c\n\t\u0001é😀</s>&""#);
        out.clear();
        write_string("é😀", true, &mut out);
        assert_eq!(out, r#""\u00e9\ud83d\ude00""#);
    }
}
