//! The format reward: does the response follow `<think>…</think><answer>…</answer>`?

use super::{Reward, Verifier};

/// 1.0 when the response is exactly `<think>…</think>` followed by `<answer>…</answer>`
/// (whitespace allowed around and between them, each tag exactly once, nothing else outside),
/// else 0.0. The reference is ignored. Rewarding the shape separately (with a small weight,
/// see [`super::WeightedSum`]) is how R1-style recipes teach the model the template.
#[derive(Debug, Clone, Copy, Default)]
pub struct FormatVerifier;

const TAGS: [&str; 4] = ["<think>", "</think>", "<answer>", "</answer>"];

/// Why the response does not have the expected shape, or `None` when it does.
pub fn format_problem(response: &str) -> Option<String> {
    let mut positions = [0usize; 4];
    for (slot, tag) in positions.iter_mut().zip(TAGS) {
        let count = response.matches(tag).count();
        if count != 1 {
            return Some(format!("{tag} appears {count} times"));
        }
        *slot = response.find(tag).unwrap_or(0);
    }
    if !positions.windows(2).all(|w| w[0] < w[1]) {
        return Some("tags out of order".into());
    }
    let [think, think_end, answer, answer_end] = positions;
    let outside = [
        &response[..think],
        &response[think_end + TAGS[1].len()..answer],
        &response[answer_end + TAGS[3].len()..],
    ];
    if outside.iter().any(|s| !s.trim().is_empty()) {
        return Some("text outside the tags".into());
    }
    None
}

impl Verifier for FormatVerifier {
    fn score(&self, response: &str, _reference: &str) -> Reward {
        match format_problem(response) {
            None => Reward::new(1.0, "format ok"),
            Some(why) => Reward::zero(format!("bad format: {why}")),
        }
    }
}
