//! Tests of `math_task`.
