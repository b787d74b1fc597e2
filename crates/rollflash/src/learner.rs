//! `PolicyLearner`: the real training step. Re-scores a batch of trajectories with the
//! policy (log-probs under the sampling temperature, as the engine recorded them),
//! computes group advantages, the configured policy loss, and one AdamW step, then hands
//! the new weights to the controller for publication (in process, no disk round trip).

use std::sync::Arc;

use candle_core::{Device, Tensor};
use rollflash_core::buffer::Batch;
use rollflash_core::{PolicyVersion, Trajectory};
use rollflash_model::train::{
    token_stats, AdamW, GradAccumulator, OptimizerConfig, TrainableModel,
};
use rollflash_rollout::WeightUpdate;
use rollflash_train::advantage::{compute_advantages, AdvantageBatch, AdvantageEstimator};
use rollflash_train::loss::{policy_loss, LossConfig, PolicyLossInputs};

use crate::controller::{Learner, LearnerError, StepStats};

/// Settings of the training step.
#[derive(Debug, Clone)]
pub struct LearnerConfig {
    pub optimizer: OptimizerConfig,
    pub loss: LossConfig,
    pub advantage: AdvantageEstimator,
    /// The sampling temperature of the rollouts: log-probs are re-computed under it.
    pub temperature: f64,
    /// CPU threads of the trainer.
    pub threads: usize,
}

/// The trainer's model and optimiser state.
pub struct PolicyLearner {
    model: TrainableModel,
    opt: AdamW,
    cfg: LearnerConfig,
    pool: rayon::ThreadPool,
    device: Device,
}

impl std::fmt::Debug for PolicyLearner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyLearner")
            .field("cfg", &self.cfg)
            .finish()
    }
}

fn err(e: impl std::fmt::Display) -> LearnerError {
    LearnerError(e.to_string())
}

impl PolicyLearner {
    /// A learner training `model`.
    pub fn new(model: TrainableModel, cfg: LearnerConfig) -> Result<Self, LearnerError> {
        cfg.loss.validate().map_err(err)?;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(cfg.threads.max(1))
            .thread_name(|i| format!("rollflash-trainer-{i}"))
            .build()
            .map_err(err)?;
        Ok(PolicyLearner {
            model,
            opt: AdamW::new(cfg.optimizer.clone()),
            cfg,
            pool,
            device: Device::Cpu,
        })
    }

    /// The model being trained.
    pub fn model(&self) -> &TrainableModel {
        &self.model
    }

    fn step(
        &mut self,
        batch: &Batch<Trajectory>,
    ) -> Result<(WeightUpdate, StepStats), LearnerError> {
        let mut seqs: Vec<&[u32]> = Vec::new();
        let mut rewards = Vec::new();
        let mut group_sizes = Vec::new();
        let mut mask = Vec::new();
        let mut behav = Vec::new();
        for g in &batch.groups {
            group_sizes.push(g.samples.len());
            for (t, r) in &g.samples {
                seqs.push(&t.tokens);
                rewards.push(*r);
                mask.extend(t.loss_mask.iter().map(|&m| m == 1));
                behav.extend_from_slice(&t.logprobs);
            }
        }
        let model = &self.model;
        let opt = &mut self.opt;
        let cfg = &self.cfg;
        let device = &self.device;
        let (stats, opt_stats, behav_kl) = self.pool.install(|| -> Result<_, LearnerError> {
            let ts = token_stats(model.model(), &seqs, cfg.temperature, false).map_err(err)?;
            let offsets = &ts.offsets[..ts.offsets.len() - 1];
            let adv = compute_advantages(
                &cfg.advantage,
                &AdvantageBatch {
                    rewards: &rewards,
                    group_sizes: &group_sizes,
                    seq_offsets: offsets,
                    mask: &mask,
                    kl: None,
                },
            )
            .map_err(err)?;
            let n = mask.len();
            let dtype = ts.logprobs.dtype();
            let to_t = |v: Vec<f32>| {
                Tensor::from_vec(v, n, device)
                    .and_then(|t| t.to_dtype(dtype))
                    .map_err(err)
            };
            let adv_t = to_t(adv.iter().map(|&a| a as f32).collect())?;
            let mask_t = to_t(mask.iter().map(|&m| if m { 1.0 } else { 0.0 }).collect())?;
            let behav_t = to_t(behav.clone())?;
            // One optimiser step per batch: the proximal ("old") policy is the policy at the
            // start of the step, numerically equal to the current one.
            let old = ts.logprobs.detach();
            let mut inputs =
                PolicyLossInputs::new(&ts.logprobs, &old, &behav_t, &adv_t, &mask_t, offsets);
            inputs.entropy = Some(&ts.entropy);
            inputs.seq_scores = Some(&rewards);
            let out = policy_loss(&inputs, &cfg.loss).map_err(err)?;
            // Train–inference mismatch: the mean of `behav − proximal` over response tokens
            // estimates KL(π_behav‖π_proximal); at staleness 0 it is pure numerics (≈0).
            let proximal = old
                .to_dtype(candle_core::DType::F64)
                .and_then(|t| t.to_vec1::<f64>())
                .map_err(err)?;
            let (mut gap, mut n_tok) = (0.0, 0usize);
            for ((&m, &b), &p) in mask.iter().zip(&behav).zip(&proximal) {
                if m {
                    gap += f64::from(b) - p;
                    n_tok += 1;
                }
            }
            let behav_kl = gap / n_tok.max(1) as f64;
            let grads = out.loss.backward().map_err(err)?;
            let mut acc = GradAccumulator::default();
            acc.add(model, &grads).map_err(err)?;
            let st = opt.step(model, &acc).map_err(err)?;
            Ok((out.metrics, st, behav_kl))
        })?;
        let new = Arc::new(self.model.snapshot().map_err(err)?);
        let version = PolicyVersion(batch.version.0 + 1);
        let mut metrics = vec![
            ("pg_loss".to_string(), stats.pg_loss),
            ("approx_kl".to_string(), stats.approx_kl),
            ("clip_frac".to_string(), stats.clip_frac),
            ("ratio_mean".to_string(), stats.ratio_mean),
            ("behav_kl".to_string(), behav_kl),
            ("behav_cap_frac".to_string(), stats.decoupled_cap_frac),
            ("grad_norm".to_string(), opt_stats.grad_norm),
            ("lr".to_string(), opt_stats.lr),
        ];
        if let Some(e) = stats.entropy {
            metrics.push(("entropy".to_string(), e));
        }
        Ok((
            WeightUpdate::InProcess {
                model: new,
                version,
            },
            StepStats {
                loss: stats.total_loss,
                metrics,
            },
        ))
    }
}

impl Learner for PolicyLearner {
    fn train(
        &mut self,
        batch: &Batch<Trajectory>,
    ) -> Result<(WeightUpdate, StepStats), LearnerError> {
        self.step(batch)
    }
}

/// Checkpointing hooks (used by `crate::checkpoint`): the optimizer's state goes with the
/// weights so a resumed run continues the same moments and learning-rate schedule.
impl PolicyLearner {
    /// The optimizer.
    pub fn optimizer(&self) -> &AdamW {
        &self.opt
    }

    /// Replaces the optimizer (with one restored from a checkpoint).
    pub fn set_optimizer(&mut self, opt: AdamW) {
        self.opt = opt;
    }
}
