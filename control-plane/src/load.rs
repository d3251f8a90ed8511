//! load (placeholder).
