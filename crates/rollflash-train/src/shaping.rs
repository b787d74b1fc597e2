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
//!    `r ← (r − μ) / (σ + 1e-6)` with `μ` the group or batch mean (or 0) and `σ` the group or
//!    batch **unbiased** standard deviation, or `r ← r − μ` without a std type;
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
//! ROLL's `running` statistics are not offered.

use serde::{Deserialize, Serialize};

use crate::advantage::{
    compute_advantages_clipped, group_ranges, masked_whiten, sample_std, AdvantageBatch,
    AdvantageEstimator,
};
use crate::error::{Result, TrainError};
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
    /// ROLL `norm_mean_type`: subtract the group or batch mean reward.
    pub norm_mean_type: NormScope,
    /// ROLL `norm_std_type`: divide by the group or batch reward std (+ `norm_eps`).
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
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

/// ROLL's `reward_norm` over per-sequence rewards (see the module documentation for the
/// formula and the undefined-std rule).
pub fn normalize_rewards(
    rewards: &[f64],
    group_sizes: &[usize],
    mean_type: NormScope,
    std_type: NormScope,
    eps: f64,
) -> Result<Vec<f64>> {
    let ranges = group_ranges(group_sizes, rewards.len())?;
    if mean_type == NormScope::None && std_type == NormScope::None {
        return Ok(rewards.to_vec());
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
        };
        let sigma = match std_type {
            NormScope::None => Some(None),
            NormScope::Group => sample_std(group).map(Some),
            NormScope::Batch => batch_std.map(Some),
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
///
/// [`compute_advantages`]: crate::advantage::compute_advantages
pub fn compute_shaped_advantages(
    estimator: &AdvantageEstimator,
    shaping: &ShapingConfig,
    batch: &AdvantageBatch<'_>,
) -> Result<Shaped> {
    shaping.validate()?;
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
    let mut rewards = normalize_rewards(
        &rewards,
        batch.group_sizes,
        shaping.norm_mean_type,
        shaping.norm_std_type,
        shaping.norm_eps,
    )?;
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
    let mut adv = compute_advantages_clipped(estimator, &shaped_batch, shaping.reward_clip)?;
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
    Ok(Shaped {
        advantages: adv,
        rewards,
        metrics,
    })
}
