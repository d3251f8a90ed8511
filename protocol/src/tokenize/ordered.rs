//! JSON -> template values that keep the JSON's key order.
//!
//! minijinja's own maps sort their keys unless its `preserve_order` feature is on, and Python
//! dicts keep insertion order. Chat templates print request data (`tools | tojson`, tool-call
//! arguments), so a sorted key means different tokens from vLLM. Request maps therefore become
//! [`OrderedMap`] objects, which iterate in the order the client wrote them.

use std::collections::HashMap;
use std::sync::Arc;

use minijinja::value::{Enumerator, Object, ObjectExt, ObjectRepr};
use minijinja::Value;

/// Above this many keys a map builds a hash index; below it a linear scan is faster.
const INDEX_THRESHOLD: usize = 12;

/// A string-keyed map that iterates in insertion order (Python `dict` semantics).
#[derive(Debug, Default)]
pub(crate) struct OrderedMap {
    entries: Vec<(Value, Value)>,
    index: Option<HashMap<Arc<str>, usize>>,
}

impl OrderedMap {
    /// A map of the given entries; a later duplicate key replaces the earlier value in place
    /// (what Python's `dict` does).
    pub(crate) fn from_entries<K: Into<Arc<str>>>(
        entries: impl IntoIterator<Item = (K, Value)>,
    ) -> Self {
        let mut map = OrderedMap::default();
        for (key, value) in entries {
            map.insert(key.into(), value);
        }
        map
    }

    /// Inserts or replaces `key`, keeping the position of an existing key.
    pub(crate) fn insert(&mut self, key: Arc<str>, value: Value) {
        if let Some(pos) = self.position(&key) {
            self.entries[pos].1 = value;
            return;
        }
        self.entries.push((Value::from(key.clone()), value));
        let len = self.entries.len();
        if let Some(index) = &mut self.index {
            index.insert(key, len - 1);
        } else if len > INDEX_THRESHOLD {
            let index = self
                .entries
                .iter()
                .enumerate()
                .filter_map(|(i, (k, _))| k.as_str().map(|k| (Arc::<str>::from(k), i)))
                .collect();
            self.index = Some(index);
        }
    }

    fn position(&self, key: &str) -> Option<usize> {
        match &self.index {
            Some(index) => index.get(key).copied(),
            None => self
                .entries
                .iter()
                .position(|(k, _)| k.as_str() == Some(key)),
        }
    }

    /// Wraps the map as a template value.
    pub(crate) fn into_value(self) -> Value {
        Value::from_object(self)
    }
}

impl Object for OrderedMap {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let pos = self.position(key.as_str()?)?;
        Some(self.entries[pos].1.clone())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        self.mapped_key_value_enumerator(|this| Box::new(this.entries.iter().cloned()))
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.entries.len())
    }
}

/// Converts request JSON to a template value: objects become [`OrderedMap`]s, integers stay
/// integers and other numbers become floats (as Python's `json.loads` makes them).
pub(crate) fn json_to_value(json: &serde_json::Value) -> Value {
    match json {
        serde_json::Value::Null => Value::from(()),
        serde_json::Value::Bool(b) => Value::from(*b),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        serde_json::Value::String(s) => Value::from(s.as_str()),
        serde_json::Value::Array(items) => items.iter().map(json_to_value).collect(),
        serde_json::Value::Object(map) => {
            OrderedMap::from_entries(map.iter().map(|(k, v)| (k.as_str(), json_to_value(v))))
                .into_value()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_insertion_order_and_replaces_duplicates_in_place() {
        let mut map = OrderedMap::default();
        for key in ["zeta", "alpha", "mid"] {
            map.insert(Arc::from(key), Value::from(key.len()));
        }
        map.insert(Arc::from("alpha"), Value::from(99));
        let value = map.into_value();
        let keys: Vec<String> = value.try_iter().unwrap().map(|k| k.to_string()).collect();
        assert_eq!(keys, ["zeta", "alpha", "mid"]);
        assert_eq!(value.get_attr("alpha").unwrap(), Value::from(99));
    }

    #[test]
    fn large_maps_index_lookups() {
        let json: serde_json::Value = serde_json::from_str(&format!(
            "{{{}}}",
            (0..40)
                .rev()
                .map(|i| format!("\"k{i}\": {i}"))
                .collect::<Vec<_>>()
                .join(",")
        ))
        .unwrap();
        let value = json_to_value(&json);
        assert_eq!(value.get_attr("k7").unwrap(), Value::from(7));
        assert_eq!(
            value.try_iter().unwrap().next().unwrap().as_str(),
            Some("k39")
        );
        assert_eq!(value.len(), Some(40));
    }
}
