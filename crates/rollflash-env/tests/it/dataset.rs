//! Tests of `dataset`.
