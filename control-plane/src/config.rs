//! config (placeholder).
