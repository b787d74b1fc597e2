//! The cost model's fits: least squares of the engine's step times and of the learner's
//! step times. Pure arithmetic on measured points, so tests can check it on known data.

use rollflash_sim::{InferenceCost, TrainCost};

/// One engine step as the cost model sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepSample {
    /// Sequences that got a token in this step.
    pub batch: f64,
    /// Their contexts (prompt and tokens so far), summed.
    pub context: f64,
    /// Prompt tokens prefilled in this step.
    pub prefill: f64,
    /// Seconds the step took.
    pub secs: f64,
}

/// Least squares of `secs ≈ a + b·batch + c·context + p·prefill`, negatives clamped to 0
/// (a coefficient the data cannot see is dropped and the rest refitted).
pub fn fit_inference(steps: &[StepSample]) -> InferenceCost {
    let rows: Vec<([f64; 4], f64)> = steps
        .iter()
        .map(|s| ([1.0, s.batch, s.context, s.prefill], s.secs))
        .collect();
    let mut active = [true; 4];
    let mut coef = [0.0; 4];
    for _ in 0..4 {
        coef = least_squares(&rows, &active);
        let mut changed = false;
        for k in 0..4 {
            if active[k] && coef[k] < 0.0 {
                active[k] = false;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    InferenceCost {
        step_s: coef[0].max(0.0),
        seq_s: coef[1].max(0.0),
        context_token_s: coef[2].max(0.0),
        prefill_token_s: coef[3].max(0.0),
    }
}

/// `secs ≈ a + b·tokens` over (tokens, secs) points of training steps; when noise swamps
/// the intercept (a negative coefficient), a proportional fit through the origin.
pub fn fit_training(points: &[(f64, f64)]) -> TrainCost {
    let rows: Vec<([f64; 4], f64)> = points
        .iter()
        .map(|&(tok, s)| ([1.0, tok, 0.0, 0.0], s))
        .collect();
    let mut c = least_squares(&rows, &[true, true, false, false]);
    if c[0] < 0.0 || c[1] < 0.0 {
        c = least_squares(&rows, &[false, true, false, false]);
    }
    TrainCost {
        step_s: c[0].max(0.0),
        token_s: c[1].max(0.0),
        parallel_efficiency: 1.0,
        first_step_s: 0.0,
    }
}

/// Ordinary least squares over the active columns (normal equations, Gaussian
/// elimination with partial pivoting; 4 unknowns at most). Inactive columns, and columns
/// the data leaves undetermined, get 0.
pub fn least_squares(rows: &[([f64; 4], f64)], active: &[bool; 4]) -> [f64; 4] {
    let idx: Vec<usize> = (0..4).filter(|&k| active[k]).collect();
    let n = idx.len();
    let mut m = vec![vec![0.0; n + 1]; n];
    for (x, y) in rows {
        for (i, &a) in idx.iter().enumerate() {
            for (j, &b) in idx.iter().enumerate() {
                m[i][j] += x[a] * x[b];
            }
            m[i][n] += x[a] * y;
        }
    }
    for col in 0..n {
        let Some(piv) = (col..n).max_by(|&a, &b| m[a][col].abs().total_cmp(&m[b][col].abs()))
        else {
            continue;
        };
        m.swap(col, piv);
        let d = m[col][col];
        if d.abs() < 1e-300 {
            continue;
        }
        let pivot = m[col].clone();
        for (r, row) in m.iter_mut().enumerate() {
            if r != col {
                let f = row[col] / d;
                for (x, p) in row.iter_mut().zip(&pivot).skip(col) {
                    *x -= f * p;
                }
            }
        }
    }
    let mut out = [0.0; 4];
    for (i, &k) in idx.iter().enumerate() {
        if m[i][i].abs() > 1e-300 {
            out[k] = m[i][n] / m[i][i];
        }
    }
    out
}

/// How much slower measured steps ran than `cost` predicts for them (at least 1): the
/// contention of sharing the machine with something else.
pub fn slowdown(steps: &[StepSample], cost: &InferenceCost) -> f64 {
    let predicted: f64 = steps
        .iter()
        .map(|s| {
            cost.step_time(s.batch as u64, s.context as u64, 0) + cost.prefill_token_s * s.prefill
        })
        .sum();
    let measured: f64 = steps.iter().map(|s| s.secs).sum();
    (measured / predicted.max(1e-12)).max(1.0)
}
