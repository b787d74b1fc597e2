//! Sampling parameters and the sampler: temperature, top-k, top-p, with the log-prob of every
//! sampled token under the distribution it was drawn from.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{ModelError, Result};

pub use rollflash_core::SamplingParams;

/// One sampled token and its log-probability under `softmax(logits / temperature)` over the
/// whole vocabulary (temperature 1 when greedy). Top-k/top-p only restrict which token may be
/// drawn: the trainer recomputes exactly this log-prob from its own logits and the same
/// temperature, which is what off-policy corrections need.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampled {
    pub token: u32,
    pub logprob: f32,
}

/// Samples token number `index` of a request seeded with `seed` from one row of logits.
pub fn sample(logits: &[f32], params: &SamplingParams, seed: u64, index: u64) -> Result<Sampled> {
    if logits.is_empty() {
        return Err(ModelError::InvalidRequest("empty logits".into()));
    }
    let t = if params.temperature > 0.0 {
        params.temperature
    } else {
        1.0
    };
    let scaled: Vec<f64> = logits.iter().map(|&l| l as f64 / t).collect();
    let max = scaled.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let lse = max + scaled.iter().map(|&s| (s - max).exp()).sum::<f64>().ln();
    let logprob_of = |tok: usize| (scaled[tok] - lse) as f32;

    if params.temperature == 0.0 {
        let tok = argmax(&scaled);
        return Ok(Sampled {
            token: tok as u32,
            logprob: logprob_of(tok),
        });
    }

    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(index);
    if params.top_k == 0 && params.top_p >= 1.0 {
        // Plain sampling needs no sort: walk the vocabulary once (a full sort per token was
        // ~15% of a SmolLM2 decode step).
        let u: f64 = rng.random::<f64>();
        let mut acc = 0.0;
        let mut chosen = scaled.len() - 1;
        for (i, &s) in scaled.iter().enumerate() {
            acc += (s - lse).exp();
            if u < acc {
                chosen = i;
                break;
            }
        }
        return Ok(Sampled {
            token: chosen as u32,
            logprob: logprob_of(chosen),
        });
    }

    // Candidates sorted by probability, truncated by top-k then top-p.
    let mut order: Vec<usize> = (0..scaled.len()).collect();
    order.sort_unstable_by(|&a, &b| scaled[b].total_cmp(&scaled[a]).then(a.cmp(&b)));
    if params.top_k > 0 && params.top_k < order.len() {
        order.truncate(params.top_k);
    }
    let probs: Vec<f64> = order.iter().map(|&i| (scaled[i] - lse).exp()).collect();
    let mut keep = probs.len();
    if params.top_p < 1.0 {
        let mut acc = 0.0;
        for (i, p) in probs.iter().enumerate() {
            acc += p;
            if acc >= params.top_p {
                keep = i + 1;
                break;
            }
        }
    }
    let total: f64 = probs[..keep].iter().sum();
    let u: f64 = rng.random::<f64>() * total;
    let mut acc = 0.0;
    let mut chosen = order[keep - 1];
    for (i, p) in probs[..keep].iter().enumerate() {
        acc += p;
        if u < acc {
            chosen = order[i];
            break;
        }
    }
    Ok(Sampled {
        token: chosen as u32,
        logprob: logprob_of(chosen),
    })
}

fn argmax(v: &[f64]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_picks_max_and_reports_log_softmax() {
        let s = sample(&[0.0, 2.0, 1.0], &SamplingParams::greedy(1), 0, 0).unwrap();
        assert_eq!(s.token, 1);
        let lse = (1.0f64 + 2f64.exp() + 1f64.exp()).ln();
        assert!((s.logprob as f64 - (2.0 - lse)).abs() < 1e-6);
    }

    #[test]
    fn top_k_one_is_greedy_and_seeded_draws_repeat() {
        let logits = [0.1, 0.3, 0.2, 0.0];
        let p = SamplingParams {
            top_k: 1,
            ..Default::default()
        };
        assert_eq!(sample(&logits, &p, 7, 3).unwrap().token, 1);
        let p = SamplingParams::default();
        let a: Vec<u32> = (0..20)
            .map(|i| sample(&logits, &p, 9, i).unwrap().token)
            .collect();
        let b: Vec<u32> = (0..20)
            .map(|i| sample(&logits, &p, 9, i).unwrap().token)
            .collect();
        assert_eq!(a, b);
        assert!(a.iter().any(|&t| t != a[0]), "a fair sampler varies: {a:?}");
    }

    #[test]
    fn plain_and_truncated_samplers_draw_the_right_frequencies() {
        // p = [0.25, 0.75]: 4000 seeded draws land within 3 percentage points, on both the
        // unsorted path (no top-k/top-p) and the sorted one (top-k = vocabulary size).
        let logits = [0.0, 3f32.ln()];
        for p in [
            SamplingParams::default(),
            SamplingParams {
                top_k: 2,
                ..Default::default()
            },
        ] {
            let ones = (0..4000)
                .filter(|&i| sample(&logits, &p, 42, i).unwrap().token == 1)
                .count();
            let f = ones as f64 / 4000.0;
            assert!((f - 0.75).abs() < 0.03, "{p:?}: frequency {f}");
        }
    }

    #[test]
    fn top_p_excludes_the_tail() {
        // p ≈ [0.87, 0.12, 0.005, ...]: top_p = 0.5 keeps only the first.
        let logits = [5.0, 3.0, 0.0, 0.0];
        let p = SamplingParams {
            top_p: 0.5,
            ..Default::default()
        };
        for i in 0..50 {
            assert_eq!(sample(&logits, &p, 1, i).unwrap().token, 0);
        }
    }
}
