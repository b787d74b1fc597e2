//! `PolicyLearner`: the real training step. Re-scores a batch of trajectories with the
//! policy (log-probs under the sampling temperature, as the engine recorded them),
//! computes group advantages, the configured policy loss, and one AdamW step, then hands
//! the new weights to the controller for publication (in process, no disk round trip).
//!
//! A frozen reference (the weights the learner started from) is kept when the loss has a
//! KL term (`loss.kl_coef`) or the advantage estimator a KL reward penalty (REINFORCE++'s
//! `kl_coef`). The penalty follows ROLL (`apply_kl_penalty`): per token, k1 of the
//! behaviour log-probs (the policy that generated the sample) against the reference,
//! `−β·(logπ_behav − logπ_ref)` added to each response token's reward before the returns.
//! Reward and advantage shaping (`rollflash_train::shaping`) runs over the whole batch; with
//! `running` reward normalisation the learner carries ROLL's running statistics from step to
//! step ([`PolicyLearner::running_moments`], saved in checkpoints). The GiGPO estimator gets
//! each trajectory's turns (generated tokens, step reward, the observation before it).
//!
//! A model with LoRA adapters ([`TrainableModel::with_lora`]) trains the same way: its
//! variables are the adapters, so gradients, clipping and AdamW state cover them alone, and
//! the published snapshot shares the frozen base with the engines.

use std::sync::Arc;

use candle_core::{Device, Tensor};
use rollflash_core::buffer::Batch;
use rollflash_core::{PolicyVersion, Trajectory};
use rollflash_model::model::Transformer;
use rollflash_model::train::{
    token_stats, AdamW, GradAccumulator, OptimizerConfig, TrainableModel,
};
use rollflash_rollout::WeightUpdate;
use rollflash_train::advantage::{AdvantageBatch, AdvantageEstimator};
use rollflash_train::gigpo::{split_turns, Turn};
use rollflash_train::kl::{kl_per_token, KlEstimator};
use rollflash_train::loss::{policy_loss, LossConfig, LossMetrics, PolicyLossInputs};
use rollflash_train::shaping::{
    compute_shaped_advantages_with, RunningMoments, ShapingConfig, ShapingMetrics,
};
use rollflash_train::LossAgg;

use crate::controller::{Learner, LearnerError, StepStats};

/// Settings of the training step.
#[derive(Debug, Clone)]
pub struct LearnerConfig {
    pub optimizer: OptimizerConfig,
    pub loss: LossConfig,
    pub advantage: AdvantageEstimator,
    /// Reward and advantage shaping around the estimator (normalisation, clipping,
    /// whitening, overlong punishment); the default does nothing. The overlong limit must be
    /// resolved (`max_len` set) by whoever builds this config.
    pub shaping: ShapingConfig,
    /// The sampling temperature of the rollouts: log-probs are re-computed under it.
    pub temperature: f64,
    /// CPU threads of the trainer.
    pub threads: usize,
    /// Sequences per forward/backward pass; gradients are accumulated over the batch and
    /// one optimiser step is taken (0 = the whole batch at once). Bounds activation memory.
    pub micro_batch_size: usize,
    /// Where the trainer's tensors live (the run plan's device).
    pub device: Device,
}

/// The trainer's model and optimiser state.
pub struct PolicyLearner {
    model: TrainableModel,
    opt: AdamW,
    cfg: LearnerConfig,
    pool: rayon::ThreadPool,
    device: Device,
    /// The frozen policy the KL term and the KL reward penalty are measured against (the
    /// weights the learner started from), kept only when one of them is on.
    reference: Option<Transformer>,
    /// ROLL's running reward statistics, merged with every trained batch when
    /// `shaping.norm_*_type = "running"`; checkpointed, so a resumed run continues them.
    running: RunningMoments,
}

impl std::fmt::Debug for PolicyLearner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyLearner")
            .field("cfg", &self.cfg)
            .finish()
    }
}

fn err<E: Into<LearnerError>>(e: E) -> LearnerError {
    e.into()
}

impl PolicyLearner {
    /// A learner training `model`.
    pub fn new(model: TrainableModel, cfg: LearnerConfig) -> Result<Self, LearnerError> {
        cfg.loss.validate().map_err(err)?;
        cfg.shaping.validate().map_err(err)?;
        if let Some(o) = &cfg.shaping.overlong {
            o.lengths().map_err(err)?;
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(cfg.threads.max(1))
            .thread_name(|i| format!("rollflash-trainer-{i}"))
            .build()
            .map_err(err)?;
        let reference = if cfg.loss.kl_coef > 0.0 || cfg.advantage.reward_kl_coef() > 0.0 {
            Some(model.snapshot().map_err(err)?)
        } else {
            None
        };
        Ok(PolicyLearner {
            reference,
            running: RunningMoments::default(),
            model,
            opt: AdamW::new(cfg.optimizer.clone()),
            device: cfg.device.clone(),
            cfg,
            pool,
        })
    }

    /// The model being trained.
    pub fn model(&self) -> &TrainableModel {
        &self.model
    }

    /// One training step, in its stages: pack the batch, score it with the reference (when a
    /// KL term needs it), the shaped advantages over the whole batch, the loss and one
    /// optimiser step over its micro-batches, then the snapshot and the step's metrics.
    fn step(
        &mut self,
        batch: &Batch<Trajectory>,
    ) -> Result<(WeightUpdate, StepStats), LearnerError> {
        let packed = PackedBatch::new(batch)?;
        let ref_logp = self.reference_logprobs(&packed)?;
        let advs = batch_advantages(
            &self.cfg.advantage,
            &self.cfg.shaping,
            &packed,
            ref_logp.as_deref(),
            self.running,
        )?;
        let opt = self.optimise(&packed, &advs.advantages, ref_logp.as_deref())?;
        let new = Arc::new(self.model.snapshot().map_err(err)?);
        let mut metrics = vec![
            ("pg_loss".to_string(), opt.loss.pg_loss),
            ("approx_kl".to_string(), opt.loss.approx_kl),
            ("clip_frac".to_string(), opt.loss.clip_frac),
            // Two means of the PPO ratio, named apart: over valid tokens, and over valid
            // sequences of each one's token mean (ROLL's `actor/ratio_mean`).
            ("ratio_mean_token".to_string(), opt.loss.ratio_mean_token()),
            ("ratio_mean_seq".to_string(), opt.loss.ratio_mean_seq()),
            ("behav_kl".to_string(), opt.behav_kl),
            ("behav_cap_frac".to_string(), opt.loss.cap_frac),
            ("grad_norm".to_string(), opt.step.grad_norm),
            ("lr".to_string(), opt.step.lr),
        ];
        if let Some(e) = opt.loss.entropy {
            metrics.push(("entropy".to_string(), e));
        }
        if let Some(k) = opt.loss.kl_loss {
            metrics.push(("kl_ref".to_string(), k));
        }
        metrics.extend(advs.metrics(&self.cfg.shaping));
        self.running = advs.running;
        Ok((
            WeightUpdate::InProcess {
                model: new,
                version: batch.version.next(),
            },
            StepStats {
                loss: opt.loss.total_loss,
                metrics,
                behav_kl_by_backend: packed
                    .backends
                    .names
                    .into_iter()
                    .zip(opt.behav_kl_by_backend)
                    .collect(),
            },
        ))
    }

    /// The reference's log-probs over the whole batch, once, when a KL term needs them: the
    /// reward penalty before the advantages, the loss term per micro-batch.
    fn reference_logprobs(&self, p: &PackedBatch<'_>) -> Result<Option<Vec<f32>>, LearnerError> {
        let Some(r) = &self.reference else {
            return Ok(None);
        };
        let mb = self.micro_batch(p.n_seq());
        let all = self.pool.install(|| -> Result<_, LearnerError> {
            let mut all = Vec::with_capacity(p.total());
            for start in (0..p.n_seq()).step_by(mb) {
                let end = (start + mb).min(p.n_seq());
                let ts = token_stats(r, &p.seqs[start..end], self.cfg.temperature, false)
                    .map_err(err)?;
                let v = ts
                    .logprobs
                    .to_dtype(candle_core::DType::F32)
                    .and_then(|t| t.to_vec1::<f32>())
                    .map_err(err)?;
                all.extend(v);
            }
            Ok(all)
        })?;
        if all.len() != p.total() {
            return Err(LearnerError::Layout {
                tokens: p.total(),
                mask: p.mask.len(),
                logprobs: all.len(),
            });
        }
        Ok(Some(all))
    }

    /// Sequences per forward/backward pass.
    fn micro_batch(&self, n_seq: usize) -> usize {
        match self.cfg.micro_batch_size {
            0 => n_seq.max(1),
            m => m.min(n_seq.max(1)),
        }
    }

    /// The loss over the batch's micro-batches, each weighted by its share so the summed
    /// gradients are the whole batch's, then one AdamW step; also the train–inference
    /// mismatch overall and per backend.
    fn optimise(
        &mut self,
        p: &PackedBatch<'_>,
        adv: &[f64],
        ref_all: Option<&[f32]>,
    ) -> Result<Optimised, LearnerError> {
        let n_seq = p.n_seq();
        let mb = self.micro_batch(n_seq);
        let n_mask = p.mask.iter().filter(|&&m| m).count().max(1);
        let token_weighted = matches!(self.cfg.loss.loss_agg, LossAgg::TokenMean);
        let model = &self.model;
        let loss_kl = self.cfg.loss.kl_coef > 0.0;
        let opt = &mut self.opt;
        let cfg = &self.cfg;
        let device = &self.device;
        let (offsets, mask, behav) = (&p.offsets, &p.mask, &p.behav);
        let owners = &p.backends.owner;
        let version = p.version;
        self.pool.install(|| -> Result<_, LearnerError> {
            let mut acc = GradAccumulator::default();
            let mut agg = StatsSum::default();
            let (mut gap, mut n_tok) = (0.0, 0usize);
            let mut per = vec![(0.0f64, 0usize); p.backends.names.len()];
            for start in (0..n_seq).step_by(mb) {
                let end = (start + mb).min(n_seq);
                let (t0, t1) = (offsets[start], offsets[end]);
                let chunk = &p.seqs[start..end];
                // Adapter dropout (LoRA) draws fresh masks per step and micro-batch, from
                // the batch's version and the micro-batch's first sequence: a resumed run
                // draws the same ones.
                let dropped;
                let forward = match model.lora() {
                    Some(l) if l.dropout > 0.0 => {
                        dropped = model
                            .model()
                            .with_dropout_seed((version.0 << 24) ^ start as u64);
                        &dropped
                    }
                    _ => model.model(),
                };
                let ts = token_stats(forward, chunk, cfg.temperature, false).map_err(err)?;
                let dtype = ts.logprobs.dtype();
                let n = t1 - t0;
                let to_t = |v: Vec<f32>| {
                    Tensor::from_vec(v, n, device)
                        .and_then(|t| t.to_dtype(dtype))
                        .map_err(err)
                };
                let adv_t = to_t(adv[t0..t1].iter().map(|&a| a as f32).collect())?;
                let mask_t = to_t(
                    mask[t0..t1]
                        .iter()
                        .map(|&m| if m { 1.0 } else { 0.0 })
                        .collect(),
                )?;
                let behav_t = to_t(behav[t0..t1].to_vec())?;
                let local: Vec<usize> = offsets[start..end].iter().map(|o| o - t0).collect();
                // One optimiser step per batch: the proximal ("old") policy is the policy at
                // the start of the step, numerically equal to the current one.
                let old = ts.logprobs.detach();
                let ref_logp = match ref_all {
                    Some(r) if loss_kl => Some(to_t(r[t0..t1].to_vec())?),
                    _ => None,
                };
                let mut inputs =
                    PolicyLossInputs::new(&ts.logprobs, &old, &behav_t, &adv_t, &mask_t, &local);
                inputs.entropy = Some(&ts.entropy);
                inputs.seq_scores = Some(&p.rewards[start..end]);
                inputs.ref_logp = ref_logp.as_ref();
                let out = policy_loss(&inputs, &cfg.loss).map_err(err)?;
                // Each micro-batch's loss is a mean over its own sequences (or tokens);
                // weighting by its share makes the summed gradients those of the whole
                // batch's loss. With correction filters on, token shares are counted before
                // filtering.
                let weight = if token_weighted {
                    mask[t0..t1].iter().filter(|&&m| m).count() as f64 / n_mask as f64
                } else {
                    (end - start) as f64 / n_seq as f64
                };
                let grads = (&out.loss * weight)
                    .and_then(|l| l.backward())
                    .map_err(err)?;
                acc.add(model, &grads).map_err(err)?;
                agg.add(&out.metrics, weight);
                // Train–inference mismatch: the mean of `behav − proximal` over response
                // tokens estimates KL(π_behav‖π_proximal); at staleness 0 it is numerics.
                let proximal = old
                    .to_dtype(candle_core::DType::F64)
                    .and_then(|t| t.to_vec1::<f64>())
                    .map_err(err)?;
                for (k, ((&m, &b), &pr)) in mask[t0..t1]
                    .iter()
                    .zip(&behav[t0..t1])
                    .zip(&proximal)
                    .enumerate()
                {
                    if m {
                        gap += f64::from(b) - pr;
                        n_tok += 1;
                        if let Some(s) = owners[t0 + k].and_then(|o| per.get_mut(o)) {
                            s.0 += f64::from(b) - pr;
                            s.1 += 1;
                        }
                    }
                }
            }
            let step = opt.step(model, &acc).map_err(err)?;
            Ok(Optimised {
                loss: agg,
                step,
                behav_kl: gap / n_tok.max(1) as f64,
                behav_kl_by_backend: per.iter().map(|&(g, n)| g / n.max(1) as f64).collect(),
            })
        })
    }
}

/// What the loss and optimiser stage of a step reports.
struct Optimised {
    loss: StatsSum,
    step: rollflash_model::train::StepStats,
    behav_kl: f64,
    behav_kl_by_backend: Vec<f64>,
}

/// A batch laid out for training: its sequences back to back, with the per-token loss mask
/// and behaviour log-probs over the concatenation, the rewards and group sizes, and which
/// backend generated each token. Every learner starts here (the embedded one and the Tinker
/// one compute the same advantages from it).
#[derive(Debug)]
pub struct PackedBatch<'a> {
    /// The version the batch trains from.
    pub version: PolicyVersion,
    pub trajectories: Vec<&'a Trajectory>,
    pub seqs: Vec<&'a [u32]>,
    /// One per sequence.
    pub rewards: Vec<f64>,
    pub group_sizes: Vec<usize>,
    /// Over the concatenated sequences: true on the model's tokens.
    pub mask: Vec<bool>,
    /// The behaviour policy's log-prob of each token (0 off the mask).
    pub behav: Vec<f32>,
    /// Where each sequence starts, then the total.
    pub offsets: Vec<usize>,
    backends: BackendOwners,
}

impl<'a> PackedBatch<'a> {
    /// Packs `batch`; a trajectory whose tokens, mask and log-probs disagree in length is
    /// [`LearnerError::Layout`].
    pub fn new(batch: &'a Batch<Trajectory>) -> Result<Self, LearnerError> {
        let mut p = PackedBatch {
            version: batch.version,
            trajectories: Vec::new(),
            seqs: Vec::new(),
            rewards: Vec::new(),
            group_sizes: Vec::new(),
            mask: Vec::new(),
            behav: Vec::new(),
            offsets: Vec::new(),
            backends: BackendOwners::default(),
        };
        for g in &batch.groups {
            p.group_sizes.push(g.samples.len());
            for (t, r) in &g.samples {
                p.trajectories.push(t);
                p.seqs.push(&t.tokens);
                p.rewards.push(*r);
                p.mask.extend(t.loss_mask.iter().map(|&m| m == 1));
                p.behav.extend_from_slice(&t.logprobs);
                p.backends.add(t);
            }
        }
        let mut total = 0;
        for s in &p.seqs {
            p.offsets.push(total);
            total += s.len();
        }
        p.offsets.push(total);
        if p.mask.len() != total || p.behav.len() != total {
            return Err(LearnerError::Layout {
                tokens: total,
                mask: p.mask.len(),
                logprobs: p.behav.len(),
            });
        }
        Ok(p)
    }

    /// Sequences in the batch.
    pub fn n_seq(&self) -> usize {
        self.seqs.len()
    }

    /// Tokens over all sequences.
    pub fn total(&self) -> usize {
        self.offsets.last().copied().unwrap_or(0)
    }
}

/// The advantages of a packed batch, and what computing them reports.
#[derive(Debug, Clone)]
pub struct Advantages {
    /// Per token of the concatenated sequences, 0 off the mask.
    pub advantages: Vec<f64>,
    /// The running reward statistics after this batch (to keep if the step succeeds).
    pub running: RunningMoments,
    shaping: Option<ShapingMetrics>,
    gigpo: Option<rollflash_train::gigpo::GigpoStats>,
    /// Mean k1 per response token of the KL reward penalty, before β.
    reward_kl_mean: Option<f64>,
}

impl Advantages {
    /// The step metrics they contribute (shaping's fractions, the running statistics,
    /// GiGPO's step groups, the KL reward penalty).
    pub fn metrics(&self, shaping: &ShapingConfig) -> Vec<(String, f64)> {
        let mut metrics = Vec::new();
        if let Some(m) = &self.shaping {
            if shaping.reward_clip.is_some() {
                metrics.push(("reward_clip_frac".to_string(), m.reward_clip_frac));
            }
            if shaping.advantage_clip.is_some() {
                metrics.push(("advantage_clip_frac".to_string(), m.advantage_clip_frac));
            }
            if shaping.overlong.is_some() {
                metrics.push(("overlong_frac".to_string(), m.overlong_frac));
                metrics.push(("overlong_penalty".to_string(), m.overlong_penalty_mean));
            }
            if let Some(r) = m.running {
                // The statistics that normalised this batch (it included).
                metrics.push(("reward_running_mean".to_string(), r.mean));
                metrics.push(("reward_running_std".to_string(), r.std()));
            }
        }
        if let Some(g) = &self.gigpo {
            metrics.push((
                "gigpo_step_group_size".to_string(),
                g.mean_step_group_size(),
            ));
            metrics.push((
                "gigpo_singleton_frac".to_string(),
                g.singleton_steps as f64 / g.steps.max(1) as f64,
            ));
        }
        if let Some(k) = self.reward_kl_mean {
            // Mean k1 per response token, before β: what the reward penalty subtracted.
            metrics.push(("kl_reward".to_string(), k));
        }
        metrics
    }
}

/// The shaped advantages of a packed batch over the whole batch (group baselines,
/// REINFORCE++'s batch statistics, batch reward normalisation and whitening), before it is
/// cut into micro-batches: with the KL reward penalty against `ref_logp` when the estimator
/// has one, GiGPO's turns when it needs them, and `running` advanced by this batch.
pub fn batch_advantages(
    estimator: &AdvantageEstimator,
    shaping: &ShapingConfig,
    p: &PackedBatch<'_>,
    ref_logp: Option<&[f32]>,
    mut running: RunningMoments,
) -> Result<Advantages, LearnerError> {
    let reward_kl = match ref_logp {
        Some(r) if estimator.reward_kl_coef() > 0.0 => {
            let b: Vec<f64> = p.behav.iter().map(|&x| f64::from(x)).collect();
            let r: Vec<f64> = r.iter().map(|&x| f64::from(x)).collect();
            Some(kl_per_token(KlEstimator::K1, &b, &r, &p.mask).map_err(err)?)
        }
        _ => None,
    };
    // Step-level estimators (GiGPO) see each trajectory's turns.
    let turns: Option<Vec<Vec<Turn<'_>>>> = if estimator.needs_turns() {
        let mut all = Vec::with_capacity(p.n_seq());
        for (t, (&start, &end)) in p
            .trajectories
            .iter()
            .zip(p.offsets.iter().zip(&p.offsets[1..]))
        {
            let lengths: Vec<usize> = t.turns.iter().map(|turn| turn.tokens).collect();
            all.push(
                split_turns(
                    &t.tokens,
                    &p.mask[start..end],
                    start,
                    t.prompt_len,
                    &lengths,
                    &t.step_rewards,
                )
                .map_err(err)?,
            );
        }
        Some(all)
    } else {
        None
    };
    let shaped = compute_shaped_advantages_with(
        estimator,
        shaping,
        &AdvantageBatch {
            rewards: &p.rewards,
            group_sizes: &p.group_sizes,
            seq_offsets: &p.offsets[..p.n_seq()],
            mask: &p.mask,
            kl: reward_kl.as_deref(),
        },
        turns.as_deref(),
        &mut running,
    )
    .map_err(err)?;
    let n_mask = p.mask.iter().filter(|&&m| m).count().max(1);
    Ok(Advantages {
        advantages: shaped.advantages,
        running,
        shaping: shaping.is_active().then_some(shaped.metrics),
        gigpo: shaped.gigpo,
        reward_kl_mean: reward_kl
            .as_ref()
            .map(|k| k.iter().sum::<f64>() / n_mask as f64),
    })
}

/// Which backend generated each token of a packed batch (from each trajectory's
/// `served_by`), for the train–inference mismatch per backend. A token whose backend is not
/// known (prompt and observation tokens; a trajectory whose runs do not cover its model
/// tokens) has none.
#[derive(Debug, Default)]
struct BackendOwners {
    names: Vec<String>,
    owner: Vec<Option<usize>>,
}

impl BackendOwners {
    fn add(&mut self, t: &Trajectory) {
        let start = self.owner.len();
        self.owner.resize(start + t.tokens.len(), None);
        let covered: usize = t.served_by.iter().map(|r| r.tokens).sum();
        if covered != t.response_tokens() {
            return;
        }
        let mut model_tokens = t
            .loss_mask
            .iter()
            .enumerate()
            .filter(|(_, &m)| m == 1)
            .map(|(i, _)| i);
        for run in &t.served_by {
            let o = match self.names.iter().position(|n| *n == run.backend) {
                Some(o) => o,
                None => {
                    self.names.push(run.backend.clone());
                    self.names.len() - 1
                }
            };
            for i in model_tokens.by_ref().take(run.tokens) {
                self.owner[start + i] = Some(o);
            }
        }
    }
}

/// Loss statistics of micro-batches, combined with the weights their losses carried.
#[derive(Debug, Default)]
struct StatsSum {
    pg_loss: f64,
    total_loss: f64,
    approx_kl: f64,
    clip_frac: f64,
    /// Σ ratio_mean_token × valid tokens, and the tokens.
    ratio_tok_sum: f64,
    n_tok: f64,
    /// Σ ratio_mean_seq × valid sequences, and the sequences.
    ratio_seq_sum: f64,
    n_seq: f64,
    cap_frac: f64,
    entropy: Option<f64>,
    kl_loss: Option<f64>,
}

impl StatsSum {
    fn add(&mut self, m: &LossMetrics, w: f64) {
        self.pg_loss += w * m.pg_loss;
        self.total_loss += w * m.total_loss;
        self.approx_kl += w * m.approx_kl;
        self.clip_frac += w * m.clip_frac;
        // The ratio means are combined exactly (by counts), whatever the loss weights.
        self.ratio_tok_sum += m.ratio_mean_token * m.n_valid_tokens as f64;
        self.n_tok += m.n_valid_tokens as f64;
        self.ratio_seq_sum += m.ratio_mean_seq * m.n_valid_seqs as f64;
        self.n_seq += m.n_valid_seqs as f64;
        self.cap_frac += w * m.decoupled_cap_frac;
        if let Some(e) = m.entropy {
            *self.entropy.get_or_insert(0.0) += w * e;
        }
        if let Some(k) = m.kl_loss {
            *self.kl_loss.get_or_insert(0.0) += w * k;
        }
    }
}

impl StatsSum {
    fn ratio_mean_token(&self) -> f64 {
        if self.n_tok > 0.0 {
            self.ratio_tok_sum / self.n_tok
        } else {
            1.0
        }
    }

    fn ratio_mean_seq(&self) -> f64 {
        if self.n_seq > 0.0 {
            self.ratio_seq_sum / self.n_seq
        } else {
            1.0
        }
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

    /// The running reward statistics (ROLL's `RunningMoments`) after the last step, when
    /// `running` normalisation is on (`None` otherwise: there is nothing to carry).
    pub fn running_moments(&self) -> Option<RunningMoments> {
        self.cfg.shaping.uses_running().then_some(self.running)
    }

    /// Restores the running reward statistics (from a checkpoint).
    pub fn set_running_moments(&mut self, running: RunningMoments) -> Result<(), LearnerError> {
        running.validate().map_err(err)?;
        self.running = running;
        Ok(())
    }
}
