//! Advantage estimators: rewards in, per-token advantages out, as plain `f64` data.
//!
//! No tensors here: advantages are computed once per batch, before the train step, from
//! per-sequence rewards (and optionally per-token KL estimates), and then handed to the loss as
//! a detached input. Sequences are packed (see [`SeqLayout`]) and sequences of one prompt form a
//! *group*: `group_sizes` lists the size of each group, groups being contiguous runs of
//! sequences in batch order.
//!
//! Definitions follow alibaba/ROLL (`roll/utils/functionals.py`: `reward_norm`,
//! `group_reward_norm`, `compute_reinforce_return`, `masked_whiten`, `compute_advantage`) and
//! verl's `compute_rloo_outcome_advantage`; each function's doc comment gives its formula.

use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};
use crate::gigpo::{gigpo_advantages, GigpoMode, GigpoParams, GigpoStats, Turn};
use crate::layout::SeqLayout;

/// Which advantage estimator to run, with its knobs. Serialised with a `name` tag:
/// `{"name": "grpo", "norm_by_std": true, "eps": 1e-6}`, `{"name": "rloo"}`,
/// `{"name": "reinforce_plus_plus", "kl_coef": 0.01}`, `{"name": "gigpo", "gamma": 0.95}`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "snake_case", deny_unknown_fields)]
pub enum AdvantageEstimator {
    /// GRPO: `A_i = (r_i − mean_g(r)) / (std_g(r) + eps)` within each group `g`, or just
    /// `r_i − mean_g(r)` without `norm_by_std` (Dr. GRPO). See [`grpo_advantages`].
    Grpo {
        /// Divide by the group's (unbiased, n−1) standard deviation. ROLL always does for
        /// `adv_estimator: grpo`; Dr. GRPO argues it biases towards easy / hard prompts.
        #[serde(default = "default_true")]
        norm_by_std: bool,
        /// Added to the std so that zero-variance groups give finite advantages (ROLL: 1e-6).
        #[serde(default = "default_grpo_eps")]
        eps: f64,
    },
    /// RLOO: `A_i = r_i − mean_{j≠i} r_j`. See [`rloo_advantages`].
    Rloo,
    /// REINFORCE++ (ROLL `adv_estimator: reinforce`, OpenRLHF `reinforce` /
    /// `reinforce_baseline`): token returns with a per-token KL penalty, whitened over the
    /// whole batch. See [`reinforce_pp_advantages`].
    ReinforcePlusPlus {
        /// Discount of the token-level return. ROLL's default and the usual choice is 1.
        #[serde(default = "default_gamma")]
        gamma: f64,
        /// Coefficient β of the per-token KL reward penalty `−β·kl_t` (needs `kl` in the
        /// batch when non-zero); ROLL's `add_token_level_kl` with `kl_ctrl.value`.
        #[serde(default)]
        kl_coef: f64,
        /// REINFORCE++-baseline: subtract each group's mean reward first (ROLL's
        /// `norm_mean_type: group`, OpenRLHF's `reinforce_baseline`).
        #[serde(default)]
        baseline: bool,
        /// Whiten the token advantages over all valid tokens of the batch (ROLL
        /// `whiten_advantages`). This global normalisation is what defines REINFORCE++;
        /// turning it off leaves raw returns.
        #[serde(default = "default_true")]
        whiten: bool,
        /// Added to the variance inside the square root when whitening (ROLL: 1e-8).
        #[serde(default = "default_whiten_eps")]
        eps: f64,
    },
    /// GiGPO (arXiv 2505.10978; verl-agent `compute_gigpo_outcome_advantage`): per model turn
    /// of a multi-turn trajectory, the group-normalised episode return plus
    /// `step_advantage_w` × the discounted step return normalised within the turns whose
    /// anchor observation is identical. Needs the batch's turns. See [`crate::gigpo`].
    Gigpo {
        /// Discount of the step returns (verl-agent's `algorithm.gamma` in its GiGPO
        /// scripts: 0.95).
        #[serde(default = "default_gigpo_gamma")]
        gamma: f64,
        /// Weight of the step-level advantage (verl-agent `gigpo.step_advantage_w`: 1).
        #[serde(default = "default_step_advantage_w")]
        step_advantage_w: f64,
        /// `mean_norm` (default) or `mean_std_norm` (verl-agent `gigpo.mode`).
        #[serde(default)]
        mode: GigpoMode,
        /// Added to the std in `mean_std_norm` (verl-agent: 1e-6).
        #[serde(default = "default_grpo_eps")]
        eps: f64,
    },
}

fn default_true() -> bool {
    true
}
fn default_grpo_eps() -> f64 {
    1e-6
}
fn default_gamma() -> f64 {
    1.0
}
fn default_whiten_eps() -> f64 {
    1e-8
}
fn default_gigpo_gamma() -> f64 {
    0.95
}
fn default_step_advantage_w() -> f64 {
    1.0
}

impl Default for AdvantageEstimator {
    /// GRPO with std normalisation and `eps = 1e-6`, as ROLL runs it.
    fn default() -> Self {
        AdvantageEstimator::Grpo {
            norm_by_std: true,
            eps: default_grpo_eps(),
        }
    }
}

impl AdvantageEstimator {
    /// REINFORCE++ with the defaults: γ = 1, no KL penalty, no baseline, whitened, eps 1e-8.
    pub fn reinforce_plus_plus() -> Self {
        AdvantageEstimator::ReinforcePlusPlus {
            gamma: default_gamma(),
            kl_coef: 0.0,
            baseline: false,
            whiten: true,
            eps: default_whiten_eps(),
        }
    }

    /// GiGPO with verl-agent's defaults: γ = 0.95, `step_advantage_w` 1, `mean_norm`,
    /// ε = 1e-6.
    pub fn gigpo() -> Self {
        AdvantageEstimator::Gigpo {
            gamma: default_gigpo_gamma(),
            step_advantage_w: default_step_advantage_w(),
            mode: GigpoMode::MeanNorm,
            eps: default_grpo_eps(),
        }
    }

    /// Whether the estimator needs each sequence's turns ([`crate::gigpo::Turn`]).
    pub fn needs_turns(&self) -> bool {
        matches!(self, AdvantageEstimator::Gigpo { .. })
    }

    /// Checks every knob; the error names the field (`grpo.eps`, `reinforce_plus_plus.gamma`).
    pub fn validate(&self) -> Result<()> {
        match *self {
            AdvantageEstimator::Grpo { eps, .. } => {
                if !(eps >= 0.0) || !eps.is_finite() {
                    return Err(TrainError::config(
                        "grpo.eps",
                        format!("{eps} must be >= 0"),
                    ));
                }
            }
            AdvantageEstimator::Rloo => {}
            AdvantageEstimator::ReinforcePlusPlus {
                gamma,
                kl_coef,
                eps,
                ..
            } => {
                if !(0.0..=1.0).contains(&gamma) {
                    return Err(TrainError::config(
                        "reinforce_plus_plus.gamma",
                        format!("{gamma} must be in [0, 1]"),
                    ));
                }
                if !(kl_coef >= 0.0) || !kl_coef.is_finite() {
                    return Err(TrainError::config(
                        "reinforce_plus_plus.kl_coef",
                        format!("{kl_coef} must be >= 0"),
                    ));
                }
                if !(eps > 0.0) || !eps.is_finite() {
                    return Err(TrainError::config(
                        "reinforce_plus_plus.eps",
                        format!("{eps} must be > 0"),
                    ));
                }
            }
            AdvantageEstimator::Gigpo {
                gamma,
                step_advantage_w,
                eps,
                ..
            } => {
                if !(0.0..=1.0).contains(&gamma) {
                    return Err(TrainError::config(
                        "gigpo.gamma",
                        format!("{gamma} must be in [0, 1]"),
                    ));
                }
                if !(step_advantage_w >= 0.0) || !step_advantage_w.is_finite() {
                    return Err(TrainError::config(
                        "gigpo.step_advantage_w",
                        format!("{step_advantage_w} must be >= 0"),
                    ));
                }
                if !(eps >= 0.0) || !eps.is_finite() {
                    return Err(TrainError::config(
                        "gigpo.eps",
                        format!("{eps} must be >= 0"),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// One batch as the estimators see it.
#[derive(Debug, Clone, Copy)]
pub struct AdvantageBatch<'a> {
    /// Scalar reward of each sequence.
    pub rewards: &'a [f64],
    /// Size of each group (sequences of one prompt), groups contiguous in batch order; the
    /// sizes must add up to the number of sequences. Sizes may differ (filtered or redundant
    /// groups).
    pub group_sizes: &'a [usize],
    /// Start index of each sequence in the packed token vectors.
    pub seq_offsets: &'a [usize],
    /// Per token: does it take part in the loss (a generated token, not prompt / tool output).
    pub mask: &'a [bool],
    /// Per-token KL estimate between the policy that generated the batch and the reference
    /// (see [`crate::kl::kl_per_token`]); only REINFORCE++ with `kl_coef > 0` reads it.
    pub kl: Option<&'a [f64]>,
}

impl AdvantageEstimator {
    /// β of the per-token KL reward penalty this estimator applies (REINFORCE++'s
    /// `kl_coef`; 0 for the others): when non-zero, [`AdvantageBatch::kl`] must be given.
    pub fn reward_kl_coef(&self) -> f64 {
        match self {
            AdvantageEstimator::ReinforcePlusPlus { kl_coef, .. } => *kl_coef,
            _ => 0.0,
        }
    }
}

/// Runs `estimator` on `batch`: per-token advantages, 0 on masked tokens.
///
/// GRPO and RLOO produce one value per sequence, broadcast to its tokens
/// ([`broadcast_to_tokens`]); REINFORCE++ is token-level by construction.
pub fn compute_advantages(
    estimator: &AdvantageEstimator,
    batch: &AdvantageBatch<'_>,
) -> Result<Vec<f64>> {
    compute_advantages_clipped(estimator, batch, None)
}

/// [`compute_advantages`] with REINFORCE++'s token rewards (score on the last token, KL
/// penalty on every token) clamped to `[−c, c]` when `token_reward_clip` is `Some(c)`: ROLL's
/// `compute_token_reward` with `reward_clip`. GRPO and RLOO ignore it (their rewards are
/// clipped per sequence, before, by [`crate::shaping`]).
pub fn compute_advantages_clipped(
    estimator: &AdvantageEstimator,
    batch: &AdvantageBatch<'_>,
    token_reward_clip: Option<f64>,
) -> Result<Vec<f64>> {
    Ok(compute_advantages_with_turns(estimator, batch, None, token_reward_clip)?.0)
}

/// [`compute_advantages_clipped`] with each sequence's turns (`turns[i]`: sequence `i`'s, from
/// [`crate::gigpo::split_turns`]), which step-level estimators (GiGPO) need and the others
/// ignore; GiGPO also reports how its turns grouped.
pub fn compute_advantages_with_turns(
    estimator: &AdvantageEstimator,
    batch: &AdvantageBatch<'_>,
    turns: Option<&[Vec<Turn<'_>>]>,
    token_reward_clip: Option<f64>,
) -> Result<(Vec<f64>, Option<GigpoStats>)> {
    estimator.validate()?;
    let layout = SeqLayout::new(batch.seq_offsets, batch.mask.len())?;
    layout.check_seqs("rewards", batch.rewards.len())?;
    let adv = match *estimator {
        AdvantageEstimator::Grpo { norm_by_std, eps } => {
            let seq = grpo_advantages(batch.rewards, batch.group_sizes, norm_by_std, eps)?;
            broadcast_to_tokens(&seq, batch.seq_offsets, batch.mask)
        }
        AdvantageEstimator::Rloo => {
            let seq = rloo_advantages(batch.rewards, batch.group_sizes)?;
            broadcast_to_tokens(&seq, batch.seq_offsets, batch.mask)
        }
        AdvantageEstimator::Gigpo {
            gamma,
            step_advantage_w,
            mode,
            eps,
        } => {
            let turns = turns.ok_or(TrainError::MissingInput {
                name: "turns",
                because: "the gigpo estimator needs each sequence's turns \
                          (step rewards and anchor observations)",
            })?;
            let (adv, stats) = gigpo_advantages(
                batch.rewards,
                batch.group_sizes,
                batch.seq_offsets,
                batch.mask,
                turns,
                &GigpoParams {
                    gamma,
                    step_advantage_w,
                    mode,
                    eps,
                },
            )?;
            return Ok((adv, Some(stats)));
        }
        AdvantageEstimator::ReinforcePlusPlus {
            gamma,
            kl_coef,
            baseline,
            whiten,
            eps,
        } => reinforce_pp_advantages(
            batch,
            &ReinforcePpParams {
                gamma,
                kl_coef,
                baseline,
                whiten,
                eps,
                reward_clip: token_reward_clip,
            },
        ),
    }?;
    Ok((adv, None))
}

/// Checks that `group_sizes` partitions `n` sequences into non-empty groups and returns the
/// index range of each group.
pub fn group_ranges(group_sizes: &[usize], n: usize) -> Result<Vec<std::ops::Range<usize>>> {
    let mut ranges = Vec::with_capacity(group_sizes.len());
    let mut at = 0usize;
    for (g, &size) in group_sizes.iter().enumerate() {
        if size == 0 {
            return Err(TrainError::Groups {
                reason: format!("group {g} is empty"),
            });
        }
        ranges.push(at..at + size);
        at += size;
    }
    if at != n {
        return Err(TrainError::Groups {
            reason: format!("group sizes add up to {at}, but there are {n} sequences"),
        });
    }
    Ok(ranges)
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

/// Unbiased (n−1) standard deviation, as `torch.std` computes by default; `None` for n < 2,
/// where it is undefined (torch returns NaN).
pub fn sample_std(xs: &[f64]) -> Option<f64> {
    if xs.len() < 2 {
        return None;
    }
    let m = mean(xs);
    let ss: f64 = xs.iter().map(|x| (x - m) * (x - m)).sum();
    Some((ss / (xs.len() - 1) as f64).sqrt())
}

/// GRPO advantages, one per sequence:
/// `A_i = (r_i − mean_g(r)) / (std_g(r) + eps)`, or `r_i − mean_g(r)` when `!norm_by_std`.
///
/// `std_g` is the **unbiased** (n−1) sample standard deviation over the group, as in ROLL's
/// `reward_norm` / `group_reward_norm` (`torch.std(..., dim=-1)`) and verl's GRPO; ROLL's eps
/// is 1e-6. A group of one sequence has no baseline and gets `A = 0` (ROLL would produce NaN
/// from `torch.std` of one element; verl instead keeps `A = r`).
pub fn grpo_advantages(
    rewards: &[f64],
    group_sizes: &[usize],
    norm_by_std: bool,
    eps: f64,
) -> Result<Vec<f64>> {
    let mut out = vec![0.0; rewards.len()];
    for range in group_ranges(group_sizes, rewards.len())? {
        let group = &rewards[range.clone()];
        let Some(std) = sample_std(group) else {
            continue; // singleton: A = 0
        };
        let m = mean(group);
        for (o, r) in out[range].iter_mut().zip(group) {
            *o = if norm_by_std {
                (r - m) / (std + eps)
            } else {
                r - m
            };
        }
    }
    Ok(out)
}

/// RLOO advantages, one per sequence: `A_i = r_i − mean_{j≠i} r_j = n/(n−1)·(r_i − mean_g(r))`
/// (verl `compute_rloo_outcome_advantage`). A group of one sequence gets `A = 0`: it has no
/// other sample to serve as baseline.
pub fn rloo_advantages(rewards: &[f64], group_sizes: &[usize]) -> Result<Vec<f64>> {
    let mut out = vec![0.0; rewards.len()];
    for range in group_ranges(group_sizes, rewards.len())? {
        let group = &rewards[range.clone()];
        let n = group.len();
        if n < 2 {
            continue;
        }
        let sum: f64 = group.iter().sum();
        for (o, r) in out[range].iter_mut().zip(group) {
            *o = r - (sum - r) / (n - 1) as f64;
        }
    }
    Ok(out)
}

/// Copies each sequence's value onto its tokens: `A_t = A_{seq(t)}` where `mask[t]`, 0 elsewhere.
pub fn broadcast_to_tokens(
    seq_values: &[f64],
    seq_offsets: &[usize],
    mask: &[bool],
) -> Result<Vec<f64>> {
    let layout = SeqLayout::new(seq_offsets, mask.len())?;
    layout.check_seqs("seq_values", seq_values.len())?;
    let mut out = vec![0.0; mask.len()];
    for (range, &v) in layout.ranges().zip(seq_values) {
        for t in range {
            if mask[t] {
                out[t] = v;
            }
        }
    }
    Ok(out)
}

/// Whitens `values` over the tokens where `mask` is set:
/// `x ← (x − mean) / sqrt(var + eps)` with the masked mean and the **unbiased** masked
/// variance (ROLL `masked_whiten`, which uses `masked_var(unbiased=True)` and
/// `torch.rsqrt(var + 1e-8)`). Masked-out entries are set to 0. With fewer than two valid
/// tokens the variance is undefined and ROLL skips whitening; so does this (values are only
/// masked).
pub fn masked_whiten(values: &mut [f64], mask: &[bool], eps: f64) {
    let n = mask.iter().filter(|&&m| m).count();
    if n >= 2 {
        let sum: f64 = values
            .iter()
            .zip(mask)
            .filter(|(_, &m)| m)
            .map(|(v, _)| v)
            .sum();
        let mean = sum / n as f64;
        let ss: f64 = values
            .iter()
            .zip(mask)
            .filter(|(_, &m)| m)
            .map(|(v, _)| (v - mean) * (v - mean))
            .sum();
        let var = ss / (n - 1) as f64;
        let scale = 1.0 / (var + eps).sqrt();
        for v in values.iter_mut() {
            *v = (*v - mean) * scale;
        }
    }
    for (v, &m) in values.iter_mut().zip(mask) {
        if !m {
            *v = 0.0;
        }
    }
}

/// The knobs of [`reinforce_pp_advantages`]; same meaning as the fields of
/// [`AdvantageEstimator::ReinforcePlusPlus`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReinforcePpParams {
    /// Discount γ of the token return.
    pub gamma: f64,
    /// KL penalty coefficient β.
    pub kl_coef: f64,
    /// Subtract the group mean reward first (REINFORCE++-baseline).
    pub baseline: bool,
    /// Whiten over the batch's valid tokens.
    pub whiten: bool,
    /// Variance epsilon of the whitening.
    pub eps: f64,
    /// Clamp each token reward `ρ_t` to `[−c, c]` (ROLL's `reward_clip` in
    /// `compute_token_reward`); `None` = no clamp.
    pub reward_clip: Option<f64>,
}

/// REINFORCE++ token advantages, following ROLL's `reinforce` estimator
/// (`compute_token_reward` / `apply_kl_penalty` → `compute_reinforce_return` →
/// `masked_whiten`) and OpenRLHF's `reinforce` / `reinforce_baseline`:
///
/// 1. baseline (optional): `r_i ← r_i − mean_g(r)` over the sequence's group;
/// 2. token rewards: `ρ_t = −β·kl_t` on valid tokens, plus `r_i` on the **last valid token**
///    of sequence `i` (ROLL puts the response reward on its last token), each clamped to
///    `[−c, c]` when `reward_clip = Some(c)` (ROLL's `compute_token_reward`);
/// 3. returns over the sequence's positions: `G_t = ρ_t + γ·G_{t+1}` (with γ = 1 every valid
///    token gets `r_i − β·Σ_{s≥t} kl_s`; masked positions carry no reward but still count
///    for the discount, as in ROLL's padded layout);
/// 4. whitening (optional) of `G` over all valid tokens of the batch ([`masked_whiten`]);
///    masked tokens end up 0.
pub fn reinforce_pp_advantages(
    batch: &AdvantageBatch<'_>,
    params: &ReinforcePpParams,
) -> Result<Vec<f64>> {
    let layout = SeqLayout::new(batch.seq_offsets, batch.mask.len())?;
    layout.check_seqs("rewards", batch.rewards.len())?;
    let kl = match (batch.kl, params.kl_coef != 0.0) {
        (Some(kl), true) => {
            layout.check_tokens("kl", kl.len())?;
            Some(kl)
        }
        (None, true) => {
            return Err(TrainError::MissingInput {
                name: "kl",
                because: "reinforce_plus_plus.kl_coef is non-zero",
            })
        }
        (_, false) => None,
    };
    let rewards = if params.baseline {
        let mut centred = batch.rewards.to_vec();
        for range in group_ranges(batch.group_sizes, batch.rewards.len())? {
            let m = mean(&batch.rewards[range.clone()]);
            for r in &mut centred[range] {
                *r -= m;
            }
        }
        centred
    } else {
        // Groups are not used, but a malformed partition is still a caller bug worth reporting.
        group_ranges(batch.group_sizes, batch.rewards.len())?;
        batch.rewards.to_vec()
    };

    let mut returns = vec![0.0; batch.mask.len()];
    for (range, &reward) in layout.ranges().zip(&rewards) {
        let last_valid = range.clone().rev().find(|&t| batch.mask[t]);
        let mut g = 0.0;
        for t in range.rev() {
            let mut rho = 0.0;
            if batch.mask[t] {
                if let Some(kl) = kl {
                    rho -= params.kl_coef * kl[t];
                }
            }
            if Some(t) == last_valid {
                rho += reward;
            }
            if let Some(c) = params.reward_clip {
                rho = rho.clamp(-c, c);
            }
            g = rho + params.gamma * g;
            returns[t] = g;
        }
    }
    if params.whiten {
        masked_whiten(&mut returns, batch.mask, params.eps);
    } else {
        for (v, &m) in returns.iter_mut().zip(batch.mask) {
            if !m {
                *v = 0.0;
            }
        }
    }
    Ok(returns)
}
