//! Helpers several test modules share.

use candle_core::{DType, Tensor};
use rollflash_model::weights::Weights;

/// The settings of a run that takes seconds per step: the built-in model (random weights)
/// on tiny FrozenLake episodes writing to `dir`, 2 groups × 4 samples per step, no
/// evaluation, no progress bar. Random text is sometimes a move, and unparsable turns cost
/// 0.1, so rewards vary within groups and the gradient is not zero.
pub fn tiny_lake_sets(dir: &std::path::Path) -> Vec<String> {
    [
        format!("output_dir={:?}", dir.display().to_string()),
        "env.name=frozen_lake".into(),
        "env.is_slippery=false".into(),
        "env.invalid_action_penalty=0.1".into(),
        "env.max_steps=5".into(),
        "rollout.max_new_tokens=6".into(),
        "rollout.max_turns=5".into(),
        "rollout.max_total_tokens=220".into(),
        "buffer.groups_per_batch=2".into(),
        "buffer.group_size=4".into(),
        "train.eval_problems=0".into(),
        "metrics.progress=false".into(),
    ]
    .into()
}

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
