//! Tests of `verify`.
