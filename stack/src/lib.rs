//! Local stack launcher and process supervision.
