//! Placeholder while the macro crate is written.
