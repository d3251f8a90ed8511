//! Real-time worker (placeholder).
