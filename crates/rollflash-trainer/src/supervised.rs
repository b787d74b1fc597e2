//! The supervised step of the warm-ups: next-token loss on the tokens a mask marks, one
//! optimiser update. The math and the agentic warm-ups share it.

use candle_core::{Device, Tensor};
use rollflash_model::train::{token_stats, AdamW, GradAccumulator, TrainableModel};

use crate::LearnerError;

/// One next-token step: mean negative log-likelihood over the tokens `mask` marks (one
/// entry per token of the packed `seqs`), one AdamW update. Returns the loss.
pub fn supervised_step(
    model: &TrainableModel,
    opt: &mut AdamW,
    seqs: &[&[u32]],
    mask: &[f32],
    device: &Device,
) -> Result<f32, LearnerError> {
    let n_loss: f32 = mask.iter().sum::<f32>().max(1.0);
    let s = token_stats(model.model(), seqs, 1.0, false)?;
    let m = Tensor::from_vec(mask.to_vec(), s.logprobs.dims1()?, device)?;
    let loss = ((s.logprobs * m)?.sum_all()?.neg()? / f64::from(n_loss))?;
    let grads = loss.backward()?;
    let mut acc = GradAccumulator::default();
    acc.add(model, &grads)?;
    opt.step(model, &acc)?;
    Ok(loss.to_scalar::<f32>()?)
}
