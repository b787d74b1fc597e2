//! Held-out evaluation: greedy success (and the math task's format-free accuracy) and
//! sampled pass@1 over tasks whose seeds no training group uses, the reward threshold that
//! counts as a success per environment, and how a result is printed.

use std::sync::Arc;

use rollflash_core::proxy::GroupId;
use rollflash_env::envs::EnvConfig;
use rollflash_env::Env;
use rollflash_rollout::{EnvFactory, EnvManager};
use serde::{Deserialize, Serialize};

/// Held-out greedy evaluation of a policy on the configured task.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EvalResult {
    /// Tasks evaluated (one greedy trajectory each).
    pub tasks: usize,
    /// Mean total reward.
    pub mean_reward: f64,
    /// Fraction of tasks whose reward reached the task's success threshold (accuracy for
    /// math, success rate for the grid worlds).
    pub success_rate: f64,
    /// Math only: greedy accuracy with the answer format not checked (the last number
    /// counts when `####` is missing), which separates arithmetic from format.
    #[serde(default)]
    pub format_free: Option<f64>,
    /// Pass@1 of the policy as it samples (the rollout temperature), averaged over
    /// `train.eval_samples` samples per task: the accuracy RL papers report beside greedy.
    #[serde(default)]
    pub sampled: Option<SampledEval>,
    /// Standard error of `success_rate`: binomial over the tasks, `sqrt(p (1 - p) / n)`.
    #[serde(default)]
    pub success_se: f64,
}

/// Sampled evaluation: `samples` trajectories per task at the rollout temperature.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SampledEval {
    pub samples: usize,
    pub temperature: f64,
    /// Mean over tasks and samples of reaching the success threshold.
    pub success_rate: f64,
    pub mean_reward: f64,
    /// Standard error of `success_rate` over the tasks: the sample standard deviation of the
    /// per-task success fractions over `sqrt(n)`. A task's samples are not independent of
    /// each other (an easy task is solved by most of them), so the `n · samples` draws are
    /// not pooled as if they were.
    #[serde(default)]
    pub success_se: f64,
}

/// Standard error of a success rate `p` measured on `n` independent tasks (binomial).
pub fn binomial_se(p: f64, n: usize) -> f64 {
    if n == 0 {
        return 0.0;
    }
    (p * (1.0 - p) / n as f64).max(0.0).sqrt()
}

/// Standard error of the mean of `xs` (the sample standard deviation, `n - 1` in its
/// denominator, over `sqrt(n)`); 0 for fewer than two values.
pub fn mean_se(xs: &[f64]) -> f64 {
    let n = xs.len();
    if n < 2 {
        return 0.0;
    }
    let mean = xs.iter().sum::<f64>() / n as f64;
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    (var / n as f64).sqrt()
}

/// Episode seeds for evaluation, far from the training seeds so no task is shared; the
/// dataset task maps these seeds to its held-out rows.
const EVAL_SEED_BASE: u64 = rollflash_env::envs::dataset_task::HELD_OUT_SEED_BASE;

/// The reward at or above which an episode of `env` counts as a success: the math task's
/// (and tool use's) exact answer scores 1; FrozenLake's goal scores its goal reward; a
/// solved Sokoban room adds `solved_reward`, which step costs and box rewards cannot
/// reach on their own, so half of it separates solved from unsolved.
pub fn success_threshold(env: &EnvConfig) -> f64 {
    match env {
        EnvConfig::Math(_) | EnvConfig::Dataset(_) | EnvConfig::ToolUse(_) => 1.0,
        EnvConfig::FrozenLake(c) => c.reward_schedule.0,
        EnvConfig::Sokoban(c) => c.solved_reward / 2.0,
    }
}

/// One line: greedy success and reward, format-free accuracy and sampled pass@1 if known.
pub fn describe_eval(e: &EvalResult) -> String {
    let mut s = format!(
        "greedy success {:.3} (mean reward {:.3}) on {} tasks",
        e.success_rate, e.mean_reward, e.tasks
    );
    if let Some(f) = e.format_free {
        s.push_str(&format!(", format-free {f:.3}"));
    }
    if let Some(p) = e.sampled {
        s.push_str(&format!(
            ", sampled pass@1 {:.3} ({} per task, T={})",
            p.success_rate, p.samples, p.temperature
        ));
    }
    s
}

/// Greedy evaluation over `n` held-out tasks (episode seeds far from training's), each a
/// one-trajectory group; `None` when `n` is 0. A task whose environment cannot be built
/// or whose trajectory fails scores 0.
pub async fn evaluate(
    envs: &EnvManager,
    make: &EnvFactory,
    n: usize,
    success_threshold: f64,
) -> Option<EvalResult> {
    if n == 0 {
        return None;
    }
    let runs = run_eval(envs, make, n, 1, "greedy evaluation").await;
    let (mut sum, mut ok, mut free, mut has_free) = (0.0, 0usize, 0.0, false);
    for (_, reward, format_free) in &runs {
        sum += reward;
        ok += usize::from(*reward >= success_threshold);
        if let Some(f) = format_free {
            free += f;
            has_free = true;
        }
    }
    let success_rate = ok as f64 / n as f64;
    Some(EvalResult {
        tasks: n,
        mean_reward: sum / n as f64,
        success_rate,
        format_free: has_free.then(|| free / n as f64),
        sampled: None,
        success_se: binomial_se(success_rate, n),
    })
}

/// Pass@1 at the sampling temperature of `envs`: `k` trajectories on each of the same `n`
/// held-out tasks as [`evaluate`].
pub async fn evaluate_sampled(
    envs: &EnvManager,
    make: &EnvFactory,
    n: usize,
    k: usize,
    temperature: f64,
    success_threshold: f64,
) -> Option<SampledEval> {
    if n == 0 || k == 0 {
        return None;
    }
    let runs = run_eval(envs, make, n, k, "sampled evaluation").await;
    let total = runs.len().max(1) as f64;
    let mut per_task = vec![0.0; n];
    for (task, r, _) in &runs {
        if let Some(slot) = per_task.get_mut(*task).filter(|_| *r >= success_threshold) {
            *slot += 1.0 / k as f64;
        }
    }
    Some(SampledEval {
        samples: k,
        temperature,
        success_rate: runs
            .iter()
            .filter(|(_, r, _)| *r >= success_threshold)
            .count() as f64
            / total,
        mean_reward: runs.iter().map(|(_, r, _)| r).sum::<f64>() / total,
        success_se: mean_se(&per_task),
    })
}

/// `(task, reward, format_free)` of `k` trajectories on each of `n` held-out tasks (`task`
/// in `0..n`), with a progress bar named `what` on a terminal.
async fn run_eval(
    envs: &EnvManager,
    make: &EnvFactory,
    n: usize,
    k: usize,
    what: &str,
) -> Vec<(usize, f64, Option<f64>)> {
    let bar = crate::progress::PhaseBar::new(what, (n * k) as u64, "trajectories");
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n as u64 {
        for j in 0..k {
            let envs = envs.clone();
            let make = Arc::clone(make);
            tasks.spawn(async move {
                let mut env: Box<dyn Env> = match make() {
                    Ok(e) => e,
                    Err(_) => return (i as usize, 0.0, None),
                };
                let t = envs
                    .run_trajectory(env.as_mut(), EVAL_SEED_BASE + i, j, GroupId(u64::MAX - i))
                    .await;
                let free = t
                    .env_metrics
                    .iter()
                    .find(|(name, _)| name == "format_free")
                    .map(|(_, v)| *v);
                (i as usize, t.reward, free)
            });
        }
    }
    let mut out = Vec::with_capacity(n * k);
    while let Some(r) = tasks.join_next().await {
        // A panicked trajectory scores 0 like a failed one; its task is not known (no index).
        out.push(r.unwrap_or((usize::MAX, 0.0, None)));
        bar.inc();
    }
    out
}
