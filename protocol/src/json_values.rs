//! Parsing a JSON body into a tree with a bound on its values: the gateway's filter and the
//! control plane both parse bodies clients send, and bytes alone do not bound what a tree
//! costs. A tree costs tens of bytes per value (an empty object in an order-preserving map
//! more): 15 MiB of `[{},{},...]` (5 million values) grew about 55× in the control plane's
//! parse, and ran the filter's wasm VM out of memory. The parse here counts values as it builds
//! them and stops at the first past [`MAX_JSON_VALUES`], in the same single pass.

use std::cell::Cell;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, Error, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// The most JSON values (objects, arrays, strings, numbers, ...) a body parsed into a tree may
/// hold: twice a 262,144-token prompt given as token ids.
pub const MAX_JSON_VALUES: usize = 1 << 19;

/// Arrays and objects nested this deep are refused (127 levels parse): serde_json's recursion
/// bound, which keeps
/// a hostile body from exhausting the stack. Python's `json` (vLLM's parser) takes about 1,000
/// levels, so a request nested between 128 and ~1,000 levels deep is refused here that the
/// engine would take; no chat or tool schema seen in practice comes near it.
pub const MAX_JSON_DEPTH: usize = 128;

/// Why [`parse_bounded`] gave no tree.
#[derive(Debug)]
pub enum BoundedParseError {
    /// More than [`MAX_JSON_VALUES`] values.
    TooMany,
    /// Arrays and objects nested [`MAX_JSON_DEPTH`] levels deep or more.
    TooDeep,
    /// Not JSON (syntax error, truncated, trailing bytes, `NaN`).
    Json(serde_json::Error),
}

impl fmt::Display for BoundedParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BoundedParseError::TooMany => {
                write!(f, "holds more than {MAX_JSON_VALUES} JSON values")
            }
            BoundedParseError::TooDeep => {
                write!(
                    f,
                    "nests JSON arrays and objects {MAX_JSON_DEPTH} levels deep or more (at most {} parse)",
                    MAX_JSON_DEPTH - 1
                )
            }
            BoundedParseError::Json(e) => write!(f, "not valid JSON: {e}"),
        }
    }
}

impl std::error::Error for BoundedParseError {}

/// `body` as a tree, as `serde_json::from_slice::<Value>` gives it (key order kept, a repeated
/// key's last value at its first position), unless it holds more than [`MAX_JSON_VALUES`]
/// values: then nothing past the bound is built.
///
/// # Errors
/// See [`BoundedParseError`].
pub fn parse_bounded(body: &[u8]) -> Result<Value, BoundedParseError> {
    let count = Cell::new(0);
    let mut reader = serde_json::Deserializer::from_slice(body);
    match Bounded(&count)
        .deserialize(&mut reader)
        .and_then(|value| reader.end().map(|()| value))
    {
        Ok(value) => Ok(value),
        Err(_) if count.get() > MAX_JSON_VALUES => Err(BoundedParseError::TooMany),
        // serde_json names its recursion bound in words only.
        Err(e) if e.to_string().starts_with("recursion limit exceeded") => {
            Err(BoundedParseError::TooDeep)
        }
        Err(e) => Err(BoundedParseError::Json(e)),
    }
}

/// Builds one value, counting it (and, through itself, every value inside it).
#[derive(Clone, Copy)]
struct Bounded<'a>(&'a Cell<usize>);

impl Bounded<'_> {
    fn count<E: Error>(self, value: Value) -> Result<Value, E> {
        self.0.set(self.0.get() + 1);
        if self.0.get() > MAX_JSON_VALUES {
            return Err(E::custom("too many values"));
        }
        Ok(value)
    }
}

impl<'de> DeserializeSeed<'de> for Bounded<'_> {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Bounded<'_> {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: Error>(self, b: bool) -> Result<Value, E> {
        self.count(Value::Bool(b))
    }
    fn visit_i64<E: Error>(self, n: i64) -> Result<Value, E> {
        self.count(Value::Number(n.into()))
    }
    fn visit_u64<E: Error>(self, n: u64) -> Result<Value, E> {
        self.count(Value::Number(n.into()))
    }
    fn visit_f64<E: Error>(self, n: f64) -> Result<Value, E> {
        self.count(Number::from_f64(n).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E: Error>(self, s: &str) -> Result<Value, E> {
        self.count(Value::String(s.to_owned()))
    }
    fn visit_string<E: Error>(self, s: String) -> Result<Value, E> {
        self.count(Value::String(s))
    }
    fn visit_unit<E: Error>(self) -> Result<Value, E> {
        self.count(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        // Counted first, so that a deep or long container stops as soon as it passes.
        self.count::<A::Error>(Value::Null)?;
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        self.count::<A::Error>(Value::Null)?;
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value_seed(self)?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn array_of_empty_objects(n: usize) -> Vec<u8> {
        let mut body = b"[".to_vec();
        body.extend(std::iter::repeat_n(&b"{},"[..], n - 1).flatten());
        body.extend(b"{}]");
        body
    }

    #[test]
    fn nesting_past_the_depth_bound_is_named_as_such() {
        let nested = |depth: usize| {
            let mut body = "[".repeat(depth);
            body.push('1');
            body.push_str(&"]".repeat(depth));
            body.into_bytes()
        };
        assert!(parse_bounded(&nested(MAX_JSON_DEPTH - 1)).is_ok());
        let err = parse_bounded(&nested(MAX_JSON_DEPTH)).unwrap_err();
        assert!(matches!(err, BoundedParseError::TooDeep), "{err}");
        assert!(err.to_string().contains("128 levels deep"), "{err}");
        // A syntax error stays one.
        assert!(matches!(
            parse_bounded(b"[[1]"),
            Err(BoundedParseError::Json(_))
        ));
    }

    #[test]
    fn gives_what_serde_json_gives() {
        for body in [
            &br#"{"b":1,"a":[1,-2,3.5,"x\u00e9",null,true,{}],"b":2}"#[..],
            b" 12 ",
            br#""s""#,
            b"[]",
            b"1e400",
        ] {
            let ours = parse_bounded(body).ok();
            let theirs = serde_json::from_slice::<Value>(body).ok();
            assert_eq!(ours, theirs, "{}", String::from_utf8_lossy(body));
            if let (Some(Value::Object(a)), Some(Value::Object(b))) = (&ours, &theirs) {
                assert!(a.keys().eq(b.keys()));
            }
        }
        for bad in [&b"[1,"[..], b"1 2", b"NaN", b"{\"a\":}"] {
            assert!(matches!(
                parse_bounded(bad),
                Err(BoundedParseError::Json(_))
            ));
        }
    }

    #[test]
    fn stops_past_the_bound_and_not_before() {
        // The array and MAX − 1 objects: exactly the bound.
        let fits = array_of_empty_objects(MAX_JSON_VALUES - 1);
        assert_eq!(
            parse_bounded(&fits).unwrap().as_array().map(Vec::len),
            Some(MAX_JSON_VALUES - 1)
        );
        let over = array_of_empty_objects(MAX_JSON_VALUES);
        assert!(matches!(
            parse_bounded(&over),
            Err(BoundedParseError::TooMany)
        ));
        // Past the bound wins over a syntax error later on.
        let mut truncated = over.clone();
        truncated.pop();
        assert!(matches!(
            parse_bounded(&truncated),
            Err(BoundedParseError::TooMany)
        ));
        assert_eq!(
            BoundedParseError::TooMany.to_string(),
            "holds more than 524288 JSON values"
        );
    }
}
