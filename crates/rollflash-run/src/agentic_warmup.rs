//! The supervised warm-up of the agentic (FrozenLake) task: whole multi-turn episodes
//! played by the optimal policy (a breadth-first shortest path to the goal around the
//! holes), rendered token for token the way the `EnvManager`'s plain renderer renders a
//! real episode, and trained with next-token loss on the moves only. The built-in model
//! starts from random weights; without this it never produces a move word and RL has no
//! signal.

use std::collections::VecDeque;

use rollflash_env::envs::frozen_lake::{Lake, Tile};
use rollflash_env::envs::{Direction, FrozenLake, FrozenLakeConfig};
use rollflash_env::Env;
use rollflash_model::tokenizer::Tokenizer;
use rollflash_model::train::TrainableModel;

use crate::plan::WarmupSettings;
use crate::warmup::WarmupError;

/// The first move of a shortest path from `state` to the goal that avoids holes, if one
/// exists (ties broken in Gymnasium's action order, so the demonstrations are consistent).
pub fn optimal_move(lake: &Lake, state: usize) -> Option<Direction> {
    let n = lake.num_states();
    // Breadth-first search backwards would need the inverse of `moved`; forwards from
    // each first move is as cheap on a 16-cell lake.
    let dist_to_goal = |from: usize| -> Option<usize> {
        let mut seen = vec![false; n];
        let mut q = VecDeque::from([(from, 0usize)]);
        seen[from] = true;
        while let Some((s, d)) = q.pop_front() {
            match lake.tile(s) {
                Some(Tile::Goal) => return Some(d),
                Some(Tile::Hole) | None => continue,
                _ => {}
            }
            for dir in Direction::ALL {
                let t = lake.moved(s, dir);
                if !seen[t] {
                    seen[t] = true;
                    q.push_back((t, d + 1));
                }
            }
        }
        None
    };
    Direction::ALL
        .into_iter()
        .filter(|&d| lake.moved(state, d) != state)
        .filter_map(|d| dist_to_goal(lake.moved(state, d)).map(|k| (k, d)))
        .min_by_key(|(k, d)| (*k, d.index()))
        .map(|(_, d)| d)
}

/// A whole demonstration: what the warm-up trains on, and how the episode went.
#[derive(Debug, Clone, PartialEq)]
pub struct Demonstration {
    pub ids: Vec<u32>,
    /// 1 on the moves and their end-of-sequence tokens, 0 on observations.
    pub mask: Vec<f32>,
    /// The episode's return (1 when it reached the goal).
    pub reward: f64,
}

/// One demonstration: the tokens of an episode from `seed` played optimally, except that
/// each turn takes a uniformly random move with probability `random_move_prob` (decided
/// by a hash of the seed and turn, so the data is reproducible), and its loss mask (1 on
/// the model's moves and their end-of-sequence tokens), cut at `max_total_tokens`.
pub async fn demonstration(
    lake_cfg: &FrozenLakeConfig,
    tok: &Tokenizer,
    seed: u64,
    max_turns: usize,
    max_total_tokens: usize,
    random_move_prob: f64,
) -> Result<Demonstration, WarmupError> {
    let eos = tok.eos_token_id().ok_or_else(|| WarmupError::NoEos)?;
    let mut env = FrozenLake::new(lake_cfg.clone())?;
    let reset = env.reset(seed).await?;
    let mut ids: Vec<u32> = tok.bos_token_id().into_iter().collect();
    ids.extend(tok.encode(&reset.observation, false)?);
    let mut mask = vec![0f32; ids.len()];
    let mut reward = 0.0;
    for turn in 0..max_turns as u64 {
        let Some((lake, state)) = env.position() else {
            break;
        };
        let Some(best) = optimal_move(lake, state) else {
            break;
        };
        let mv = if crate::warmup::unit_hash(seed, turn, 0) < random_move_prob {
            let k = (crate::warmup::unit_hash(seed, turn, 1) * 4.0) as usize;
            Direction::ALL[k.min(3)]
        } else {
            best
        };
        let action = tok.encode(mv.word(), false)?;
        if ids.len() + action.len() + 1 > max_total_tokens {
            break;
        }
        ids.extend(&action);
        ids.push(eos);
        mask.extend(std::iter::repeat_n(1.0, action.len() + 1));
        let step = env.step(mv.word()).await?;
        reward += step.reward;
        if step.terminated || step.truncated {
            break;
        }
        // The plain renderer after a turn that stopped: observation, then the separator.
        let obs = tok.encode(&format!("{}\n", step.observation), false)?;
        if ids.len() + obs.len() >= max_total_tokens {
            break;
        }
        mask.extend(std::iter::repeat_n(0.0, obs.len()));
        ids.extend(obs);
    }
    Ok(Demonstration { ids, mask, reward })
}

/// Seeds of warm-up episodes: far from both the training seeds and evaluation's.
const WARMUP_SEED_BASE: u64 = 1 << 44;

/// Trains `model` on `section.steps` batches of `section.batch_size` demonstrations (optimal
/// moves, random ones with probability `random_move_prob`).
pub async fn run(
    model: &TrainableModel,
    tok: &Tokenizer,
    lake_cfg: &FrozenLakeConfig,
    settings: &WarmupSettings,
    stop: &rollflash_trainer::StopFlag,
) -> Result<(), WarmupError> {
    let w = &settings.section;
    let what = format!(
        "{} FrozenLake episodes (optimal moves, random with probability {})",
        w.batch_size, w.random_move_prob
    );
    crate::warmup::sft_loop(model, settings, &what, stop, |step| async move {
        let mut seqs = Vec::with_capacity(w.batch_size);
        let mut mask = Vec::new();
        for i in 0..w.batch_size {
            let seed = WARMUP_SEED_BASE
                .wrapping_add(settings.seed.wrapping_mul(1 << 32))
                .wrapping_add((step * w.batch_size + i) as u64);
            let d = demonstration(
                lake_cfg,
                tok,
                seed,
                settings.max_turns,
                settings.max_total_tokens,
                w.random_move_prob,
            )
            .await?;
            mask.extend(d.mask);
            seqs.push(d.ids);
        }
        Ok((seqs, mask))
    })
    .await
}
