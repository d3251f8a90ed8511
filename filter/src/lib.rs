//! Switchyard proxy-wasm filter.
