//! Tests of `envs`.
