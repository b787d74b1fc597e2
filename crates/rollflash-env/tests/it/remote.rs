//! Tests of `remote`.
