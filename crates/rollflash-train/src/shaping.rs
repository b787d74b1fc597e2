//! Reward and advantage shaping around the estimators: what ROLL does to the scores before
//! and to the advantages after [`compute_advantages`].
//!
//! The order is ROLL's (`roll/utils/functionals.py`: `reward_postprocess` →
//! `compute_token_reward` → `compute_advantage`), with DAPO's length shaping first because it
//! is part of the reward:
//!
//! 1. **soft overlong punishment** (DAPO, arXiv 2503.14476, eq. 13; verl's
//!    `reward_manager/dapo.py` `overlong_buffer`): with `L` the sequence's generated tokens,
//!    `L_max` the limit and `L_cache` the buffer,
//!    `R_len = 0` if `L ≤ L_max − L_cache`, `((L_max − L_cache) − L) / L_cache` inside the
//!    buffer, `−1` beyond `L_max`; times `penalty_factor` (verl), added to the score;
//! 2. **reward normalisation** (ROLL `reward_norm`, `norm_mean_type` / `norm_std_type`):
//!    `r ← (r − μ) / (σ + 1e-6)` with `μ` the group, batch or running mean (or 0) and `σ` the
//!    group or batch **unbiased** standard deviation or the running one, or `r ← r − μ`
//!    without a std type. `running` statistics are ROLL's `RunningMoments`
//!    ([`RunningMoments`]): merged with the batch's rewards *before* they normalise it, and
//!    carried from step to step (and across a resume) by the caller;
//! 3. **reward clipping** (ROLL `reward_clip`): `r ← clamp(r, −c, c)`; REINFORCE++ also clips
//!    its token rewards (after the KL penalty) to the same bound, as ROLL's
//!    `compute_token_reward` does;
//! 4. the estimator ([`compute_advantages`]);
//! 5. **advantage whitening** for every estimator (ROLL `whiten_advantages` →
//!    `masked_whiten` over the batch's valid tokens);
//! 6. **advantage clipping** (ROLL `advantage_clip`): `A ← clamp(A, −c, c)`.
//!
//! Edge cases, stated once: a standard deviation over fewer than two samples (a one-sample
//! group or batch) is undefined; the normalised reward is then 0, as ROLL's agentic
//! `agentic_reward_norm` makes it (its RLVR `reward_norm` would give NaN). A zero-variance
//! group gives `(r − μ)/1e-6 = 0` when the mean is subtracted; with a std type but no mean
//! type it divides the raw reward by 1e-6, exactly as ROLL does — clip the reward if you use
//! that. Whitening needs two valid tokens (ROLL skips it with fewer; so does this).
//! The running std after a first batch of one sample is infinite (ROLL's
//! `var · n/(n − 1)` with `n = 1`), which gives the same 0.

use serde::{Deserialize, Serialize};

use crate::advantage::{
    compute_advantages_with_turns, group_ranges, masked_whiten, sample_std, AdvantageBatch,
    AdvantageEstimator,
};
use crate::error::{Result, TrainError};
use crate::gigpo::{GigpoStats, Turn};
use crate::layout::SeqLayout;

/// Over which samples a reward mean or standard deviation is taken (ROLL's
/// `norm_mean_type` / `norm_std_type`; ROLL's `None` is `none`). Serialised snake_case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NormScope {
    /// No statistic: the mean is 0, there is no division.
    #[default]
    None,
    /// The sequence's group (the samples of one prompt).
    Group,
    /// The whole batch.
    Batch,
    /// Statistics of every reward seen so far, this batch included (ROLL's `running`:
    /// [`RunningMoments`], updated before normalising).
    Running,
}

/// ROLL's `RunningMoments` (`roll/utils/functionals.py`, a modified stable-baselines3
/// `RunningMeanStd`): the mean and variance of a stream of rewards, merged batch by batch
/// with the parallel-variance formula (Chan et al.). With `n` rewards of mean `m_b` and
/// **biased** variance `v_b` (`torch.var_mean(xs, unbiased=False)`), and `δ = m_b − mean`,
/// `N = count + n`:
///
/// - `mean ← mean + δ·n/N`,
/// - `var ← (var·count + δ²·count·n/N + v_b·n) / N` (biased, over all `N`),
/// - `std = sqrt(var·N/(N − 1))` (the unbiased correction of the merged variance),
/// - `count ← N`.
///
/// The stream starts at `mean = 0`, `var = 1`, `count = 1e-24` (ROLL's prior: a vanishing
/// pseudo-count, so the first batch's statistics take over). `reward_norm` calls `update`
/// with the batch *before* reading `mean` / `std`, so the current batch is part of its own
/// statistics. ROLL keeps one per domain; rollflash has one reward stream. ROLL computes in
/// float32; this is float64.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RunningMoments {
    /// Running mean.
    pub mean: f64,
    /// Running biased variance (over `count`).
    pub var: f64,
    /// Rewards merged so far, plus ROLL's 1e-24 prior.
    pub count: f64,
    /// Batches merged so far (0: the prior, whose std is ROLL's initial 1).
    pub batches: u64,
}

impl Default for RunningMoments {
    /// ROLL's initial state: mean 0, var 1 (std 1), count 1e-24.
    fn default() -> Self {
        RunningMoments {
            mean: 0.0,
            var: 1.0,
            count: 1e-24,
            batches: 0,
        }
    }
}

impl RunningMoments {
    /// Merges a batch of rewards, in ROLL's order of operations. An empty batch changes
    /// nothing (ROLL would turn the statistics into NaN).
    pub fn update(&mut self, xs: &[f64]) {
        if xs.is_empty() {
            return;
        }
        let n = xs.len() as f64;
        let xs_mean = mean(xs);
        let xs_var = xs
            .iter()
            .map(|x| (x - xs_mean) * (x - xs_mean))
            .sum::<f64>()
            / n;
        let delta = xs_mean - self.mean;
        let tot_count = self.count + n;
        let new_sum = xs_var * n;
        // The old sum of squares, corrected for the new mean.
        let old_sum = self.var * self.count + delta * delta * self.count * n / tot_count;
        let tot_sum = old_sum + new_sum;
        self.mean += delta * n / tot_count;
        self.var = tot_sum / tot_count;
        self.count = tot_count;
        self.batches += 1;
    }

    /// The running standard deviation ROLL divides by: `sqrt(var·count/(count − 1))`, or its
    /// initial 1 before any batch. Infinite after a single reward in all.
    pub fn std(&self) -> f64 {
        if self.batches == 0 {
            return 1.0;
        }
        (self.var * self.count / (self.count - 1.0)).sqrt()
    }

    /// Checks a restored state (a checkpoint's): finite, variance ≥ 0, count > 0.
    pub fn validate(&self) -> Result<()> {
        let ok = self.mean.is_finite()
            && self.var.is_finite()
            && self.var >= 0.0
            && self.count.is_finite()
            && self.count > 0.0;
        if ok {
            Ok(())
        } else {
            Err(TrainError::config(
                "shaping.running",
                format!("{self:?} is not a running-moments state"),
            ))
        }
    }
}

/// DAPO's soft overlong punishment. `max_len` and `cache_len` are in generated tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OverlongConfig {
    /// `L_max`; `None` = the run's generation limit (`rollout.max_new_tokens`), filled in
    /// by the run config before training.
    pub max_len: Option<usize>,
    /// `L_cache`, the punishment buffer before `L_max`; `None` = a fifth of `L_max`, the
    /// paper's proportion (4096 of 20480).
    pub cache_len: Option<usize>,
    /// Scale of the penalty, so it reaches `−penalty_factor` at `L_max` (verl's
    /// `overlong_buffer.penalty_factor`, default 1).
    pub penalty_factor: f64,
}

impl Default for OverlongConfig {
    fn default() -> Self {
        OverlongConfig {
            max_len: None,
            cache_len: None,
            penalty_factor: 1.0,
        }
    }
}

impl OverlongConfig {
    /// `(L_max, L_cache)`, or an error naming `overlong.max_len` if it was never resolved.
    pub fn lengths(&self) -> Result<(usize, usize)> {
        let max = self.max_len.ok_or(TrainError::MissingInput {
            name: "overlong.max_len",
            because: "the soft overlong punishment needs L_max (the run config fills it in)",
        })?;
        let cache = self.cache_len.unwrap_or(max / 5);
        Ok((max, cache))
    }

    /// The penalty (≤ 0) of a sequence of `len` generated tokens.
    pub fn penalty(&self, len: usize) -> Result<f64> {
        let (max, cache) = self.lengths()?;
        let start = max.saturating_sub(cache);
        let raw = if len <= start {
            0.0
        } else if len <= max {
            // cache > 0 here: len > start = max − cache and len ≤ max.
            (start as f64 - len as f64) / cache as f64
        } else {
            -1.0
        };
        Ok(raw * self.penalty_factor)
    }
}

/// Everything done to scores and advantages around the estimator. The default does nothing.
/// Field names mirror ROLL's pipeline options.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShapingConfig {
    /// ROLL `norm_mean_type`: subtract the group, batch or running mean reward.
    pub norm_mean_type: NormScope,
    /// ROLL `norm_std_type`: divide by the group, batch or running reward std
    /// (+ `norm_eps`).
    pub norm_std_type: NormScope,
    /// Added to the std (ROLL's `reward_norm`: 1e-6).
    pub norm_eps: f64,
    /// ROLL `reward_clip`: clamp rewards (and REINFORCE++'s token rewards) to `[−c, c]`.
    pub reward_clip: Option<f64>,
    /// DAPO's soft overlong punishment, added to the score first.
    pub overlong: Option<OverlongConfig>,
    /// ROLL `whiten_advantages`: whiten the estimator's advantages over the batch's valid
    /// tokens, for every estimator.
    pub whiten_advantages: bool,
    /// ROLL `advantage_clip`: clamp advantages to `[−c, c]` (after whitening).
    pub advantage_clip: Option<f64>,
}

impl Default for ShapingConfig {
    fn default() -> Self {
        ShapingConfig {
            norm_mean_type: NormScope::None,
            norm_std_type: NormScope::None,
            norm_eps: 1e-6,
            reward_clip: None,
            overlong: None,
            whiten_advantages: false,
            advantage_clip: None,
        }
    }
}

impl ShapingConfig {
    /// Whether anything is shaped.
    pub fn is_active(&self) -> bool {
        *self != ShapingConfig::default()
    }

    /// Whether rewards are normalised by running statistics, which then live from step to
    /// step (and in checkpoints).
    pub fn uses_running(&self) -> bool {
        self.norm_mean_type == NormScope::Running || self.norm_std_type == NormScope::Running
    }

    /// Checks every knob; errors name the field under `shaping.`.
    pub fn validate(&self) -> Result<()> {
        if !(self.norm_eps >= 0.0) || !self.norm_eps.is_finite() {
            return Err(TrainError::config(
                "shaping.norm_eps",
                format!("{} must be >= 0", self.norm_eps),
            ));
        }
        for (name, v) in [
            ("shaping.reward_clip", self.reward_clip),
            ("shaping.advantage_clip", self.advantage_clip),
        ] {
            if let Some(c) = v {
                if !(c > 0.0) || !c.is_finite() {
                    return Err(TrainError::config(name, format!("{c} must be > 0")));
                }
            }
        }
        if let Some(o) = &self.overlong {
            if o.max_len == Some(0) {
                return Err(TrainError::config(
                    "shaping.overlong.max_len",
                    "0 must be >= 1",
                ));
            }
            if let (Some(max), Some(cache)) = (o.max_len, o.cache_len) {
                if cache > max {
                    return Err(TrainError::config(
                        "shaping.overlong.cache_len",
                        format!("{cache} must be <= max_len ({max})"),
                    ));
                }
            }
            if !(o.penalty_factor >= 0.0) || !o.penalty_factor.is_finite() {
                return Err(TrainError::config(
                    "shaping.overlong.penalty_factor",
                    format!("{} must be >= 0", o.penalty_factor),
                ));
            }
        }
        Ok(())
    }
}

/// What shaping did to a batch, for logging.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct ShapingMetrics {
    /// Fraction of sequences whose (normalised) reward the reward clip moved.
    pub reward_clip_frac: f64,
    /// Fraction of valid tokens whose advantage the advantage clip moved.
    pub advantage_clip_frac: f64,
    /// Fraction of sequences the overlong punishment penalised.
    pub overlong_frac: f64,
    /// Mean overlong penalty per sequence (≤ 0).
    pub overlong_penalty_mean: f64,
    /// The running statistics after this batch, when `running` normalisation is on.
    pub running: Option<RunningMoments>,
}

/// Advantages and what went into them.
#[derive(Debug, Clone, PartialEq)]
pub struct Shaped {
    /// Per-token advantages, 0 on masked tokens.
    pub advantages: Vec<f64>,
    /// The per-sequence rewards the estimator saw (after length shaping, normalisation and
    /// clipping).
    pub rewards: Vec<f64>,
    /// What shaping did.
    pub metrics: ShapingMetrics,
    /// How GiGPO's turns fell into step groups (GiGPO only).
    pub gigpo: Option<GigpoStats>,
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

/// ROLL's `reward_norm` over per-sequence rewards (see the module documentation for the
/// formula and the undefined-std rule). `running` scopes use fresh [`RunningMoments`] — the
/// first batch of a stream; [`normalize_rewards_running`] carries them.
pub fn normalize_rewards(
    rewards: &[f64],
    group_sizes: &[usize],
    mean_type: NormScope,
    std_type: NormScope,
    eps: f64,
) -> Result<Vec<f64>> {
    normalize_rewards_running(
        rewards,
        group_sizes,
        mean_type,
        std_type,
        eps,
        &mut RunningMoments::default(),
    )
}

/// [`normalize_rewards`] with the running statistics of the stream so far: when either scope
/// is `running`, `running` first merges this batch (ROLL's `running.update(rewards)`), then
/// its mean / std normalise it. Otherwise `running` is untouched.
pub fn normalize_rewards_running(
    rewards: &[f64],
    group_sizes: &[usize],
    mean_type: NormScope,
    std_type: NormScope,
    eps: f64,
    running: &mut RunningMoments,
) -> Result<Vec<f64>> {
    let ranges = group_ranges(group_sizes, rewards.len())?;
    if mean_type == NormScope::None && std_type == NormScope::None {
        return Ok(rewards.to_vec());
    }
    if mean_type == NormScope::Running || std_type == NormScope::Running {
        running.update(rewards);
    }
    let batch_mean = if rewards.is_empty() {
        0.0
    } else {
        mean(rewards)
    };
    let batch_std = sample_std(rewards);
    let mut out = vec![0.0; rewards.len()];
    for range in ranges {
        let group = &rewards[range.clone()];
        let mu = match mean_type {
            NormScope::None => 0.0,
            NormScope::Group => mean(group),
            NormScope::Batch => batch_mean,
            NormScope::Running => running.mean,
        };
        let sigma = match std_type {
            NormScope::None => Some(None),
            NormScope::Group => sample_std(group).map(Some),
            NormScope::Batch => batch_std.map(Some),
            NormScope::Running => Some(Some(running.std())),
        };
        for (o, &r) in out[range].iter_mut().zip(group) {
            *o = match sigma {
                Some(None) => r - mu,
                Some(Some(s)) => (r - mu) / (s + eps),
                None => 0.0, // undefined std (fewer than two samples)
            };
        }
    }
    Ok(out)
}

/// Runs the whole shaping pipeline around `estimator` on `batch` (whose `rewards` are the raw
/// scores): length punishment, normalisation, clipping, the estimator, whitening, advantage
/// clipping. With the default [`ShapingConfig`] this is exactly [`compute_advantages`].
/// `running` normalisation starts from fresh statistics (a stream's first batch), and
/// step-level estimators (GiGPO) have no turns here: use [`compute_shaped_advantages_with`].
///
/// [`compute_advantages`]: crate::advantage::compute_advantages
pub fn compute_shaped_advantages(
    estimator: &AdvantageEstimator,
    shaping: &ShapingConfig,
    batch: &AdvantageBatch<'_>,
) -> Result<Shaped> {
    compute_shaped_advantages_with(
        estimator,
        shaping,
        batch,
        None,
        &mut RunningMoments::default(),
    )
}

/// [`compute_shaped_advantages`] for a training loop: `turns` are each sequence's turns (for
/// GiGPO), and `running` the reward statistics of the steps before, which this batch updates
/// when `running` normalisation is on. `running` is changed only when the whole pipeline
/// succeeds.
pub fn compute_shaped_advantages_with(
    estimator: &AdvantageEstimator,
    shaping: &ShapingConfig,
    batch: &AdvantageBatch<'_>,
    turns: Option<&[Vec<Turn<'_>>]>,
    running: &mut RunningMoments,
) -> Result<Shaped> {
    shaping.validate()?;
    running.validate()?;
    let mut next_running = *running;
    let layout = SeqLayout::new(batch.seq_offsets, batch.mask.len())?;
    layout.check_seqs("rewards", batch.rewards.len())?;
    let n_seq = batch.rewards.len();
    let mut metrics = ShapingMetrics::default();

    let mut rewards = batch.rewards.to_vec();
    if let Some(o) = &shaping.overlong {
        let mut hit = 0usize;
        let mut total = 0.0;
        for (r, range) in rewards.iter_mut().zip(layout.ranges()) {
            let len = batch.mask[range].iter().filter(|&&m| m).count();
            let p = o.penalty(len)?;
            if p < 0.0 {
                hit += 1;
            }
            total += p;
            *r += p;
        }
        if n_seq > 0 {
            metrics.overlong_frac = hit as f64 / n_seq as f64;
            metrics.overlong_penalty_mean = total / n_seq as f64;
        }
    }
    let mut rewards = normalize_rewards_running(
        &rewards,
        batch.group_sizes,
        shaping.norm_mean_type,
        shaping.norm_std_type,
        shaping.norm_eps,
        &mut next_running,
    )?;
    if shaping.uses_running() {
        metrics.running = Some(next_running);
    }
    if let Some(c) = shaping.reward_clip {
        let moved = rewards.iter().filter(|r| r.abs() > c).count();
        if n_seq > 0 {
            metrics.reward_clip_frac = moved as f64 / n_seq as f64;
        }
        for r in &mut rewards {
            *r = r.clamp(-c, c);
        }
    }

    let shaped_batch = AdvantageBatch {
        rewards: &rewards,
        ..*batch
    };
    let (mut adv, gigpo) =
        compute_advantages_with_turns(estimator, &shaped_batch, turns, shaping.reward_clip)?;
    if shaping.whiten_advantages {
        masked_whiten(&mut adv, batch.mask, 1e-8);
    }
    if let Some(c) = shaping.advantage_clip {
        let n_valid = batch.mask.iter().filter(|&&m| m).count();
        let moved = adv
            .iter()
            .zip(batch.mask)
            .filter(|(a, &m)| m && a.abs() > c)
            .count();
        if n_valid > 0 {
            metrics.advantage_clip_frac = moved as f64 / n_valid as f64;
        }
        for a in &mut adv {
            *a = a.clamp(-c, c);
        }
    }
    *running = next_running;
    Ok(Shaped {
        advantages: adv,
        rewards,
        metrics,
        gigpo,
    })
}
