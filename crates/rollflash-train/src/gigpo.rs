//! GiGPO: group-in-group advantages for multi-turn trajectories (Feng et al. 2025,
//! "Group-in-Group Policy Optimization for LLM Agent Training", arXiv 2505.10978), as its
//! reference implementation computes them: verl-agent `gigpo/core_gigpo.py`
//! (`compute_gigpo_outcome_advantage`, `episode_norm_reward`, `build_step_group`,
//! `step_norm_reward`, `compute_step_discounted_returns`).
//!
//! verl-agent trains one row per environment step (a model turn); rollflash trains one packed
//! sequence per trajectory whose model turns are its [`Turn`]s. Each turn gets one advantage,
//! broadcast to its valid tokens:
//!
//! `A(i, k) = A_episode(i, k) + step_advantage_w · A_step(i, k)`
//!
//! - **episode level** (`episode_norm_reward`, eq. 3): every turn of trajectory `i` carries
//!   the episode score `R_i` (the sequence's reward — by default the sum of its step rewards,
//!   verl-agent's `episode_rewards` placed on every step row by its `EpisodeRewardManager`).
//!   Within a prompt group the mean `μ` and **unbiased** std `σ` are taken over the group's
//!   *turns*, not its trajectories (verl-agent's default `compute_mean_std_cross_steps=True`:
//!   a trajectory of `K` turns counts `K` times). `A_episode = R_i − μ` (`mean_norm`) or
//!   `(R_i − μ)/(σ + ε)` (`mean_std_norm`). A group with a single turn in all has `μ = 0`,
//!   `σ = 1`: its advantage is `R_i` (`R_i/(1 + ε)`), not 0.
//! - **step returns** (`compute_step_discounted_returns`, eq. 5):
//!   `G(i, k) = Σ_{j ≥ k} γ^{j−k} r(i, j)` over trajectory `i`'s step rewards.
//! - **anchor-state groups** (`build_step_group`, eq. 6): within one prompt group, turns whose
//!   anchor observations are *identical* form a step group (verl-agent clusters by equality
//!   of `anchor_obs`; its optional similarity clustering, off by default, is not offered).
//!   Here the anchor of a turn is the token sequence the environment added just before it:
//!   the prompt for the first turn, the observation tokens between two turns for the others.
//! - **step level** (`step_norm_reward`, eq. 7): `A_step = G − mean_s(G)` (`mean_norm`) or
//!   `(G − mean_s(G))/(std_s(G) + ε)` (`mean_std_norm`) over the turn's step group `s`
//!   (unbiased std). A singleton step group has mean `G` and std 1, so `A_step = 0`.
//!
//! Defaults are verl-agent's: `step_advantage_w = 1`, `mode = mean_norm`, `ε = 1e-6`, and
//! `γ = 0.95` — the `algorithm.gamma` of every GiGPO script verl-agent ships
//! (`examples/gigpo_trainer/run_*.sh`) and the paper's setting; verl's shared default of 1.0
//! applies to its other estimators. verl-agent computes in float32; this is float64.
//!
//! One difference of layout, stated: the observation tokens include the few tokens the
//! renderer adds to close the previous model turn, which differ when that turn ended at the
//! token limit instead of its stop token, so such a turn's anchor never equals one after a
//! turn that stopped — the split is conservative (two different states are never merged).

use std::collections::HashMap;
use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};
use crate::layout::SeqLayout;

/// verl-agent's `algorithm.gigpo.mode`: how both levels normalise within their groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GigpoMode {
    /// Subtract the group mean only (verl-agent's default).
    #[default]
    MeanNorm,
    /// Subtract the group mean and divide by the group's unbiased std plus `ε`.
    MeanStdNorm,
}

/// The knobs of [`gigpo_advantages`]; same meaning as the fields of
/// [`crate::AdvantageEstimator::Gigpo`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GigpoParams {
    /// Discount γ of the step returns.
    pub gamma: f64,
    /// Weight of the step-level advantage.
    pub step_advantage_w: f64,
    /// Normalisation of both levels.
    pub mode: GigpoMode,
    /// Added to the std in `mean_std_norm`.
    pub eps: f64,
}

/// One model turn of a multi-turn sequence, as step-level estimators see it.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn<'a> {
    /// The turn's generated tokens, as indices into the packed batch.
    pub tokens: Range<usize>,
    /// The environment's reward for the step this turn took.
    pub reward: f64,
    /// What the environment showed the model just before this turn (the prompt, or the
    /// observation after the previous turn): GiGPO's anchor state.
    pub anchor: &'a [u32],
}

/// How the turns of a batch fell into step groups, for logging.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct GigpoStats {
    /// Turns in the batch (verl-agent's step rows).
    pub steps: usize,
    /// Anchor-state groups they formed.
    pub step_groups: usize,
    /// Turns alone in their step group (no step-level signal).
    pub singleton_steps: usize,
}

impl GigpoStats {
    /// Mean size of a step group (verl-agent prints it as "Avg size of step-level group");
    /// 0 for a batch without turns.
    pub fn mean_step_group_size(&self) -> f64 {
        if self.step_groups == 0 {
            0.0
        } else {
            self.steps as f64 / self.step_groups as f64
        }
    }
}

/// Cuts one trajectory's tokens into its model turns.
///
/// `tokens` and `mask` are the sequence's own (its mask: `true` on generated tokens),
/// `offset` where it starts in the packed batch, `prompt_len` the length of the first prompt,
/// `turn_lengths` the number of tokens the model generated in each turn and `step_rewards`
/// each turn's step reward. The layout is the rollout's: prompt, then per turn its generated
/// tokens followed by the environment's observation tokens (masked), up to the next turn's.
///
/// Fails (naming the turn) when the lengths do not fit the sequence, a turn covers a masked
/// token or a generated token lies outside every turn. A turn of zero tokens (no backend
/// produces one) cannot be told apart from the observation around it: its anchor runs up to
/// the next generated token.
pub fn split_turns<'a>(
    tokens: &'a [u32],
    mask: &[bool],
    offset: usize,
    prompt_len: usize,
    turn_lengths: &[usize],
    step_rewards: &[f64],
) -> Result<Vec<Turn<'a>>> {
    let n = tokens.len();
    if mask.len() != n {
        return Err(TrainError::Length {
            name: "mask",
            expected: n,
            got: mask.len(),
        });
    }
    if step_rewards.len() != turn_lengths.len() {
        return Err(TrainError::Length {
            name: "step_rewards",
            expected: turn_lengths.len(),
            got: step_rewards.len(),
        });
    }
    if prompt_len > n {
        return Err(TrainError::Layout {
            reason: format!("prompt of {prompt_len} tokens in a sequence of {n}"),
        });
    }
    let mut turns = Vec::with_capacity(turn_lengths.len());
    let (mut anchor_start, mut pos) = (0, prompt_len);
    for (k, (&len, &reward)) in turn_lengths.iter().zip(step_rewards).enumerate() {
        let end = pos + len;
        if end > n {
            return Err(TrainError::Layout {
                reason: format!("turn {k} ends at token {end}, past the sequence's {n}"),
            });
        }
        if let Some(t) = (pos..end).find(|&t| !mask[t]) {
            return Err(TrainError::Layout {
                reason: format!("turn {k} covers token {t}, which is masked"),
            });
        }
        turns.push(Turn {
            tokens: offset + pos..offset + end,
            reward,
            anchor: &tokens[anchor_start..pos],
        });
        // The observation after this turn: the masked tokens up to the next generated one.
        anchor_start = end;
        pos = end;
        while pos < n && !mask[pos] {
            pos += 1;
        }
    }
    if let Some(t) = (pos..n).find(|&t| mask[t]) {
        return Err(TrainError::Layout {
            reason: format!("generated token {t} lies outside the sequence's turns"),
        });
    }
    Ok(turns)
}

/// Mean and unbiased std of `xs`, summed in order; `None` for fewer than two values.
fn mean_std(xs: &[f64]) -> (f64, Option<f64>) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return (mean, None);
    }
    let ss: f64 = xs.iter().map(|x| (x - mean) * (x - mean)).sum();
    (mean, Some((ss / (n - 1.0)).sqrt()))
}

/// `(x − μ)` or `(x − μ)/(σ + ε)`, as `mode` says.
fn normalise(x: f64, mean: f64, std: f64, mode: GigpoMode, eps: f64) -> f64 {
    match mode {
        GigpoMode::MeanNorm => x - mean,
        GigpoMode::MeanStdNorm => (x - mean) / (std + eps),
    }
}

/// GiGPO token advantages (see the module documentation for every formula and edge case).
///
/// `rewards` are the episode scores `R_i` (one per sequence), `group_sizes` the prompt groups,
/// `seq_offsets` / `mask` the packed layout and `turns[i]` sequence `i`'s turns (from
/// [`split_turns`]). Tokens outside every turn and masked tokens get 0.
pub fn gigpo_advantages(
    rewards: &[f64],
    group_sizes: &[usize],
    seq_offsets: &[usize],
    mask: &[bool],
    turns: &[Vec<Turn<'_>>],
    params: &GigpoParams,
) -> Result<(Vec<f64>, GigpoStats)> {
    let layout = SeqLayout::new(seq_offsets, mask.len())?;
    layout.check_seqs("rewards", rewards.len())?;
    layout.check_seqs("turns", turns.len())?;
    for (i, seq_turns) in turns.iter().enumerate() {
        let range = layout.range(i);
        if let Some(t) = seq_turns
            .iter()
            .find(|t| t.tokens.start < range.start || t.tokens.end > range.end)
        {
            return Err(TrainError::Layout {
                reason: format!(
                    "a turn of sequence {i} covers tokens {:?}, outside the sequence's {range:?}",
                    t.tokens
                ),
            });
        }
    }
    let mut out = vec![0.0; mask.len()];
    let mut stats = GigpoStats::default();
    for group in crate::advantage::group_ranges(group_sizes, rewards.len())? {
        // The group's step rows in batch order: (sequence, turn).
        let rows: Vec<(usize, usize)> = group
            .clone()
            .flat_map(|i| (0..turns[i].len()).map(move |k| (i, k)))
            .collect();
        if rows.is_empty() {
            continue;
        }
        stats.steps += rows.len();

        // Episode level: R_i once per turn (verl-agent's cross-step statistics).
        let scores: Vec<f64> = rows.iter().map(|&(i, _)| rewards[i]).collect();
        let (ep_mean, ep_std) = match mean_std(&scores) {
            (_, None) => (0.0, 1.0), // one step row: mean 0, std 1 (verl-agent)
            (m, Some(s)) => (m, s),
        };

        // Step returns, per trajectory, backwards.
        let mut returns: HashMap<(usize, usize), f64> = HashMap::with_capacity(rows.len());
        for i in group.clone() {
            let mut g = 0.0;
            for (k, turn) in turns[i].iter().enumerate().rev() {
                g = turn.reward + params.gamma * g;
                returns.insert((i, k), g);
            }
        }

        // Anchor-state groups, in order of first appearance.
        let mut index: HashMap<&[u32], usize> = HashMap::new();
        let mut clusters: Vec<Vec<(usize, usize)>> = Vec::new();
        for &(i, k) in &rows {
            let anchor = turns[i][k].anchor;
            let c = *index.entry(anchor).or_insert_with(|| {
                clusters.push(Vec::new());
                clusters.len() - 1
            });
            clusters[c].push((i, k));
        }
        stats.step_groups += clusters.len();

        for cluster in &clusters {
            let values: Vec<f64> = cluster.iter().map(|row| returns[row]).collect();
            let (mean, std) = mean_std(&values);
            // A singleton step group: mean = its own return, std 1 (verl-agent).
            let std = std.unwrap_or(1.0);
            if cluster.len() == 1 {
                stats.singleton_steps += 1;
            }
            for (&(i, k), &g) in cluster.iter().zip(&values) {
                let a_ep = normalise(rewards[i], ep_mean, ep_std, params.mode, params.eps);
                let a_step = normalise(g, mean, std, params.mode, params.eps);
                let a = a_ep + params.step_advantage_w * a_step;
                for t in turns[i][k].tokens.clone() {
                    if mask[t] {
                        out[t] = a;
                    }
                }
            }
        }
    }
    Ok((out, stats))
}
