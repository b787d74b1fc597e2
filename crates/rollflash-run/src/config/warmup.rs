//! `[warmup]`: the supervised warm-up before RL.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Supervised warm-up before RL (the built-in model starts from random weights).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WarmupSection {
    /// 0 skips the warm-up.
    pub steps: usize,
    pub batch_size: usize,
    /// AdamW learning rate. 2e-3 converges on every seed measured; 5e-3 stalled on some
    /// (`BENCHMARKS.md`, "The default over seeds").
    pub lr: f64,
    /// Fraction of warm-up solutions that stop after the worked steps, without the
    /// `#### answer` line the strict verifier reads. Real supervised data mixes answer
    /// formats; this leaves the warmed-up policy unsure of the format, which RL with a
    /// verifiable reward then settles (the run reports format-free accuracy beside it).
    pub unmarked_fraction: f64,
    /// Agentic warm-up: probability that a demonstration takes a uniformly random move
    /// instead of the optimal one at a turn (and plays on from where it lands, into a hole
    /// included). The warm-up then imitates a noisy expert, as real demonstrations are:
    /// the policy keeps probability on other moves, so RL's samples differ within a group
    /// and have something to learn from. 0: optimal play only.
    pub random_move_prob: f64,
    /// Reuse a warm-up checkpoint from an earlier run with the same settings.
    pub cache: bool,
    /// Where warm-up results are cached, shared by every run (each result under a key of
    /// its settings). Default: `$ROLLFLASH_CACHE_DIR/warmup`, else
    /// `$XDG_CACHE_HOME/rollflash/warmup`, else `~/.cache/rollflash/warmup`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_dir: Option<PathBuf>,
}

impl Default for WarmupSection {
    fn default() -> Self {
        WarmupSection {
            // 600 steps left the arithmetic seed-dependent (format-free greedy 0.765-0.960 on
            // seeds 0-2); 1000 leave 0.975-0.995, which RL then keeps (issue 30, BENCHMARKS).
            steps: 1000,
            batch_size: 64,
            lr: 2e-3,
            // Half the warm-up solutions lack the `####` line: the warmed-up policy is unsure
            // of the format, greedy picks the wrong one, and RL has to settle it (BENCHMARKS).
            unmarked_fraction: 0.5,
            random_move_prob: 0.0,
            cache: true,
            cache_dir: None,
        }
    }
}
