//! Engine core (placeholder; see module owner).
