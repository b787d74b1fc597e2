//! Saved trajectories: what the model wrote, for the inspector. [`sample_batch`] picks a
//! few trajectories of a trained batch (spread over its rewards, best and worst included)
//! and turns each into a [`TrajectoryRecord`]: the prompt, then the conversation as
//! segments — every model token its own piece with the policy version that produced it,
//! and each environment observation between turns one piece.

use rollflash_core::buffer::Batch;
use rollflash_core::{Trajectory, TrajectoryEnd};
use serde::{Deserialize, Serialize};

/// Who wrote a piece of a trajectory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The first prompt.
    Prompt,
    /// One token the model generated.
    Model,
    /// An environment observation (multi-turn) between the model's turns.
    Env,
}

/// One piece of text of a trajectory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Piece {
    pub role: Role,
    pub text: String,
    /// The policy version that produced it (model tokens), else the trajectory's start.
    pub version: u64,
}

/// One saved trajectory (a line of `trajectories.jsonl`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrajectoryRecord {
    /// The step that trained on it.
    pub step: usize,
    /// The version that step trained from.
    pub trained_version: u64,
    /// The task seed (identifies the task) and the index in its group.
    pub seed: u64,
    pub index: usize,
    pub reward: f64,
    /// The reward of each environment step.
    pub step_rewards: Vec<f64>,
    /// How it ended: `terminated`, `truncated`, `max_turns`, `max_tokens`, …
    pub finish: String,
    pub turns: usize,
    pub start_version: u64,
    /// Tokens the model generated.
    pub response_tokens: usize,
    /// Every token id of the trajectory (prompt, responses, observations) in order.
    pub token_ids: Vec<u32>,
    pub pieces: Vec<Piece>,
    /// What the environment said of it in words on its last step (the verdict, a reward
    /// function's error, a failing test's output), as `(key, text)`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<(String, String)>,
}

/// Turns token ids into text; the run passes its tokenizer's decode. Errors become a
/// placeholder: the inspector shows what it can.
pub type Decode<'a> = &'a dyn Fn(&[u32]) -> Option<String>;

/// Up to `per_step` trajectories of `batch`, spread evenly over the batch sorted by reward
/// (highest first), so both ends of the reward range are kept.
pub fn sample_batch(
    step: usize,
    batch: &Batch<Trajectory>,
    per_step: usize,
    decode: Decode<'_>,
) -> Vec<TrajectoryRecord> {
    let mut all: Vec<&(Trajectory, f64)> = batch.groups.iter().flat_map(|g| &g.samples).collect();
    if per_step == 0 || all.is_empty() {
        return Vec::new();
    }
    // Stable: ties keep batch order, so the sample does not depend on float noise.
    all.sort_by(|a, b| b.1.total_cmp(&a.1));
    let n = all.len();
    let k = per_step.min(n);
    let picks: Vec<usize> = if k == 1 {
        vec![0]
    } else {
        (0..k).map(|i| i * (n - 1) / (k - 1)).collect()
    };
    picks
        .into_iter()
        .filter_map(|i| all.get(i))
        .map(|(t, r)| record(step, batch.version.0, t, *r, decode))
        .collect()
}

/// One trajectory as a record.
pub fn record(
    step: usize,
    trained_version: u64,
    t: &Trajectory,
    reward: f64,
    decode: Decode<'_>,
) -> TrajectoryRecord {
    let start = t.start_version.0;
    let mut pieces = Vec::new();
    let prompt_len = t.prompt_len.min(t.tokens.len());
    pieces.push(Piece {
        role: Role::Prompt,
        text: text_of(&t.tokens[..prompt_len], decode),
        version: start,
    });
    let mut i = prompt_len;
    while i < t.tokens.len() {
        let model = t.loss_mask.get(i) == Some(&1);
        let end = (i..t.tokens.len())
            .find(|&j| (t.loss_mask.get(j) == Some(&1)) != model)
            .unwrap_or(t.tokens.len());
        if model {
            for (j, text) in (i..end).zip(stream_pieces(&t.tokens[i..end], decode)) {
                pieces.push(Piece {
                    role: Role::Model,
                    text,
                    version: t.versions.get(j).map_or(start, |v| v.0),
                });
            }
        } else {
            pieces.push(Piece {
                role: Role::Env,
                text: text_of(&t.tokens[i..end], decode),
                version: start,
            });
        }
        i = end;
    }
    TrajectoryRecord {
        step,
        trained_version,
        seed: t.seed,
        index: t.index,
        reward,
        step_rewards: t.step_rewards.clone(),
        finish: finish_name(t.end.as_ref()),
        turns: t.turns.len(),
        start_version: start,
        response_tokens: t.response_tokens(),
        token_ids: t.tokens.clone(),
        pieces,
        notes: t.env_text.clone(),
    }
}

fn text_of(ids: &[u32], decode: Decode<'_>) -> String {
    decode(ids).unwrap_or_else(|| format!("<{} tokens>", ids.len()))
}

/// The text each token of one model turn adds, the way streaming detokenizers do it:
/// decode a short window with and without the token and keep the difference, holding a
/// token back while it ends inside a character (byte-level BPE splits characters across
/// tokens), so every character shows once, on the token that completes it.
fn stream_pieces(tokens: &[u32], decode: Decode<'_>) -> Vec<String> {
    let (mut prefix, mut read) = (0usize, 0usize);
    let mut out = Vec::with_capacity(tokens.len());
    for i in 0..tokens.len() {
        let before = decode(&tokens[prefix..read]).unwrap_or_default();
        let with = decode(&tokens[prefix..=i]).unwrap_or_default();
        match with.strip_prefix(before.as_str()) {
            Some(rest) if !rest.is_empty() && !rest.ends_with('\u{FFFD}') => {
                out.push(rest.to_string());
                prefix = read;
                read = i + 1;
            }
            _ => out.push(String::new()),
        }
    }
    out
}

fn finish_name(end: Option<&TrajectoryEnd>) -> String {
    match end {
        None => "unknown".into(),
        Some(TrajectoryEnd::Terminated) => "terminated".into(),
        Some(TrajectoryEnd::Truncated) => "truncated".into(),
        Some(TrajectoryEnd::MaxTurns) => "max_turns".into(),
        Some(TrajectoryEnd::MaxTokens) => "max_tokens".into(),
        Some(TrajectoryEnd::Aborted) => "aborted".into(),
        Some(TrajectoryEnd::Failed(r)) => format!("failed: {r}"),
    }
}
