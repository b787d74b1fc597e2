//! Helpers several test modules share.

use candle_core::{DType, Tensor};
use rollflash_model::weights::Weights;

/// Largest absolute elementwise difference of two tensors of one shape (computed in f64).
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    let a = a.to_dtype(DType::F64).unwrap();
    let b = b.to_dtype(DType::F64).unwrap();
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f64>()
        .unwrap()
}

/// Largest [`max_abs_diff`] over two weight sets, which must hold the same tensor names.
pub fn max_weight_diff(a: &Weights, b: &Weights) -> f64 {
    let mut names = a.names();
    names.sort();
    let mut other = b.names();
    other.sort();
    assert_eq!(names, other, "the weight sets hold different tensors");
    names
        .into_iter()
        .map(|n| max_abs_diff(&a.tensors()[n], &b.tensors()[n]))
        .fold(0.0, f64::max)
}
