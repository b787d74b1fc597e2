//! The procedurally generated arithmetic task (RLVR) with a long tail of solution lengths, and its supervised warm-up data.
//!
//! A problem is a chain of terms joined by `+`/`-`, e.g. `12+7+30+5`; with `*` enabled some
//! terms are products of two numbers. The number of terms is drawn from a power law, so most
//! problems are short (`37+45`) while a tail needs long worked solutions — the workload shape
//! (a few very long generations) that asynchronous rollout is built for.
//!
//! The format is rigid so the built-in 1.6M-parameter character model learns it from a short
//! supervised warm-up. Prompt and response, for `12+7*3+5`:
//!
//! ```text
//! Q: 12+7*3+5
//! A: 7*3=21 12+21=33 33+5=38 #### 38
//! ```
//!
//! The prompt ends with `"A: "`; the response computes the products left to right, then the
//! running total left to right, each step `a op b = c` separated by one space, then
//! `#### answer`. Everything is printable ASCII plus the prompt's one newline (the built-in
//! vocabulary), and [`MathTaskConfig::validate`] proves from the configuration that prompt plus
//! solution stay within [`MAX_EXAMPLE_CHARS`], well under the model's 512-token context.
//!
//! Responses are scored by [`crate::verify::MathVerifier::strict`], whose `####` rule reads
//! the final answer (a stray number elsewhere in the response earns nothing).

use async_trait::async_trait;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map};

use crate::dataset::{seeded_rng, uniform_below, uniform_f64, Dataset, Record};
use crate::env::{Env, EnvError, Reset, Step};
use crate::verify::{MathVerifier, Verifier};

/// The built-in model's context length, in characters (one token per character).
pub const MAX_CONTEXT_CHARS: usize = 512;

/// Budget for prompt plus solution, leaving room in the context for `<bos>`, `<eos>` and a
/// model that runs on a little past the answer.
pub const MAX_EXAMPLE_CHARS: usize = 448;

/// Stream tags, so problems for environments, warm-up and datasets never coincide even for
/// equal seeds (a model warmed up on the evaluation problems would look better than it is).
const PROBLEM_STREAM: u64 = 0x0050_524f_424c_454d;
const WARMUP_STREAM: u64 = 0x0057_4152_4d55_5053;
const DATASET_STREAM: u64 = 0x0044_4154_4153_4554;

/// An arithmetic operator of the task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Operator {
    /// Joins terms.
    #[serde(rename = "+")]
    Add,
    /// Joins terms; running totals may go negative.
    #[serde(rename = "-")]
    Sub,
    /// Makes a term a product of two numbers, computed before the running total.
    #[serde(rename = "*")]
    Mul,
}

impl Operator {
    fn symbol(self) -> char {
        match self {
            Operator::Add => '+',
            Operator::Sub => '-',
            Operator::Mul => '*',
        }
    }
}

/// Settings of the math task. Defaults: 2–24 terms of up to 2 digits, additions only, term
/// count with power-law exponent 1.5 (half the problems have 2 terms; 1 in 20 has 14 or more).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MathTaskConfig {
    /// Fewest terms in a problem (at least 2, so every solution has a step).
    pub min_terms: usize,
    /// Most terms in a problem; bounds the longest solution.
    pub max_terms: usize,
    /// Exponent `s` of the term-count law: `P(min_terms + k terms) ∝ (k + 1)^-s`. Smaller
    /// means a heavier tail of long problems; 0 is uniform.
    pub tail_exponent: f64,
    /// Most digits of each number (numbers are uniform in `0..10^max_digits`).
    pub max_digits: u32,
    /// Allowed operators. `+` and `-` join terms (at least one is required); `*` makes some
    /// terms products.
    pub operators: Vec<Operator>,
    /// Probability that a term is a product, when `*` is allowed.
    pub product_prob: f64,
    /// Mixed into every problem, so tasks with different seeds draw different problems for
    /// the same episode seed.
    pub seed: u64,
}

impl Default for MathTaskConfig {
    fn default() -> Self {
        MathTaskConfig {
            min_terms: 2,
            max_terms: 24,
            tail_exponent: 1.5,
            max_digits: 2,
            operators: vec![Operator::Add],
            product_prob: 0.3,
            seed: 0,
        }
    }
}

/// Why a math task configuration is invalid.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid math task config `{field}`: {reason}")]
pub struct MathTaskError {
    /// The offending field.
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

impl From<MathTaskError> for EnvError {
    fn from(e: MathTaskError) -> Self {
        EnvError::Config {
            field: e.field.to_string(),
            reason: e.reason,
        }
    }
}

/// Decimal digits of `v` (at least 1).
fn digits(v: u64) -> usize {
    v.checked_ilog10().map_or(1, |d| d as usize + 1)
}

impl MathTaskConfig {
    fn has(&self, op: Operator) -> bool {
        self.operators.contains(&op)
    }

    /// Checks every value, including that the longest possible prompt plus solution fits
    /// [`MAX_EXAMPLE_CHARS`]; the error names the field to change.
    pub fn validate(&self) -> Result<(), MathTaskError> {
        let bad = |field, reason: String| Err(MathTaskError { field, reason });
        if self.min_terms < 2 {
            return bad(
                "min_terms",
                format!("must be at least 2, got {}", self.min_terms),
            );
        }
        if self.max_terms < self.min_terms {
            return bad(
                "max_terms",
                format!(
                    "must be at least min_terms ({}), got {}",
                    self.min_terms, self.max_terms
                ),
            );
        }
        if !(self.tail_exponent >= 0.0) || !self.tail_exponent.is_finite() {
            return bad(
                "tail_exponent",
                format!("must be finite and >= 0, got {}", self.tail_exponent),
            );
        }
        if !(1..=6).contains(&self.max_digits) {
            return bad(
                "max_digits",
                format!("must be in 1..=6, got {}", self.max_digits),
            );
        }
        if !self.has(Operator::Add) && !self.has(Operator::Sub) {
            return bad("operators", "must include \"+\" or \"-\"".into());
        }
        if !(0.0..=1.0).contains(&self.product_prob) {
            return bad(
                "product_prob",
                format!("must be in [0, 1], got {}", self.product_prob),
            );
        }
        let worst = self.max_example_chars();
        if worst > MAX_EXAMPLE_CHARS {
            return bad(
                "max_terms",
                format!(
                    "the longest prompt plus solution would be {worst} characters, over the \
                     {MAX_EXAMPLE_CHARS}-character budget of the built-in model; lower max_terms \
                     or max_digits, or drop \"*\""
                ),
            );
        }
        Ok(())
    }

    /// An upper bound on prompt plus solution length, in characters, over all problems.
    pub fn max_example_chars(&self) -> usize {
        let d = self.max_digits as usize;
        let max_num = 10u64.saturating_pow(self.max_digits).saturating_sub(1);
        let mul = self.has(Operator::Mul);
        let max_term = if mul {
            max_num.saturating_mul(max_num)
        } else {
            max_num
        };
        let term_w = digits(max_term);
        let term_text = if mul { 2 * d + 1 } else { d };
        let t = self.max_terms;
        let sign = usize::from(self.has(Operator::Sub));
        let total_w = digits(max_term.saturating_mul(t as u64)) + sign;
        let prompt = "Q: ".len() + t * term_text + t.saturating_sub(1) + "\nA: ".len();
        let products = if mul {
            t * (2 * d + 1 + 1 + term_w + 1)
        } else {
            0
        };
        let running = t.saturating_sub(1) * (total_w + 1 + term_w + 1 + total_w + 1);
        let answer = "#### ".len() + total_w;
        prompt + products + running + answer
    }
}

/// One generated problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// What the model sees: `"Q: 12+7+30+5\nA: "`.
    pub prompt: String,
    /// The reference answer: `"54"`.
    pub answer: String,
    /// The worked solution a correct response matches: `"12+7=19 19+30=49 49+5=54 #### 54"`.
    pub solution: String,
    /// Number of terms (the length parameter).
    pub terms: usize,
}

/// A term: a number, or a product of two.
#[derive(Debug, Clone, Copy)]
enum Term {
    Num(u64),
    Product(u64, u64),
}

impl Term {
    fn value(self) -> i64 {
        match self {
            Term::Num(a) => a as i64,
            Term::Product(a, b) => (a * b) as i64,
        }
    }
}

/// The arithmetic task: a validated configuration and the problem generator.
#[derive(Debug, Clone)]
pub struct MathTask {
    /// The settings.
    cfg: MathTaskConfig,
    /// Cumulative probabilities of `min_terms + k` terms, for inverse-CDF sampling.
    term_cdf: Vec<f64>,
}

impl MathTask {
    /// A task with these settings.
    pub fn new(cfg: MathTaskConfig) -> Result<MathTask, MathTaskError> {
        cfg.validate()?;
        let weights: Vec<f64> = (0..=cfg.max_terms - cfg.min_terms)
            .map(|k| ((k + 1) as f64).powf(-cfg.tail_exponent))
            .collect();
        let total: f64 = weights.iter().sum();
        let mut acc = 0.0;
        let term_cdf = weights
            .iter()
            .map(|w| {
                acc += w / total;
                acc
            })
            .collect();
        Ok(MathTask { cfg, term_cdf })
    }

    /// The settings.
    pub fn config(&self) -> &MathTaskConfig {
        &self.cfg
    }

    /// The problem for `seed` (and the configuration's seed): the same seed always gives the
    /// same problem.
    pub fn problem(&self, seed: u64) -> Problem {
        self.generate(&mut seeded_rng([self.cfg.seed, PROBLEM_STREAM, seed, 0]))
    }

    /// `n` supervised warm-up pairs `(prompt, completion)`; the completion is the worked
    /// solution without an end-of-sequence token (the trainer appends its tokenizer's). Drawn
    /// from a stream separate from [`MathTask::problem`], so warm-up never sees an environment
    /// problem by construction of the seed, only by chance.
    pub fn warmup_examples(&self, n: usize, seed: u64) -> Vec<(String, String)> {
        (0..n as u64)
            .map(|i| {
                let p = self.generate(&mut seeded_rng([self.cfg.seed, WARMUP_STREAM, seed, i]));
                (p.prompt, p.solution)
            })
            .collect()
    }

    /// `n` problems as a [`Dataset`], generated on demand (record `i` is the same on every
    /// call). The record's `extra` holds `solution` and `terms`.
    pub fn dataset(&self, n: usize, seed: u64) -> MathDataset {
        MathDataset {
            task: self.clone(),
            len: n,
            seed,
        }
    }

    /// Scores `response` against the reference `answer` with the task's verifier (1.0 or 0.0).
    pub fn score(&self, response: &str, answer: &str) -> f64 {
        MathVerifier::strict().score(response, answer).value
    }

    fn number(&self, rng: &mut ChaCha8Rng) -> u64 {
        uniform_below(rng, 10u64.pow(self.cfg.max_digits))
    }

    fn term_count(&self, rng: &mut ChaCha8Rng) -> usize {
        let u = uniform_f64(rng);
        let k = self
            .term_cdf
            .iter()
            .position(|c| u < *c)
            .unwrap_or(self.term_cdf.len().saturating_sub(1));
        self.cfg.min_terms + k
    }

    fn generate(&self, rng: &mut ChaCha8Rng) -> Problem {
        let n = self.term_count(rng);
        let joins: Vec<Operator> = self
            .cfg
            .operators
            .iter()
            .copied()
            .filter(|o| *o != Operator::Mul)
            .collect();
        let mul = self.cfg.has(Operator::Mul);
        let mut terms = Vec::with_capacity(n);
        let mut ops = Vec::with_capacity(n.saturating_sub(1));
        for i in 0..n {
            if i > 0 {
                let j = uniform_below(rng, joins.len() as u64) as usize;
                ops.push(joins.get(j).copied().unwrap_or(Operator::Add));
            }
            let product = mul && uniform_f64(rng) < self.cfg.product_prob;
            terms.push(if product {
                Term::Product(self.number(rng), self.number(rng))
            } else {
                Term::Num(self.number(rng))
            });
        }
        let text = |t: Term| match t {
            Term::Num(a) => a.to_string(),
            Term::Product(a, b) => format!("{a}*{b}"),
        };
        let mut expr = String::new();
        for (i, t) in terms.iter().enumerate() {
            if i > 0 {
                expr.push(ops[i - 1].symbol());
            }
            expr.push_str(&text(*t));
        }
        let mut steps = Vec::new();
        for t in &terms {
            if let Term::Product(a, b) = t {
                steps.push(format!("{a}*{b}={}", a * b));
            }
        }
        let mut acc = terms.first().map_or(0, |t| t.value());
        for (t, op) in terms.iter().skip(1).zip(&ops) {
            let v = t.value();
            let next = if *op == Operator::Sub {
                acc - v
            } else {
                acc + v
            };
            steps.push(format!("{acc}{}{v}={next}", op.symbol()));
            acc = next;
        }
        steps.push(format!("#### {acc}"));
        Problem {
            prompt: format!("Q: {expr}\nA: "),
            answer: acc.to_string(),
            solution: steps.join(" "),
            terms: n,
        }
    }
}

/// [`MathTask`] problems behind the [`Dataset`] interface (see [`MathTask::dataset`]).
#[derive(Debug, Clone)]
pub struct MathDataset {
    /// The generator.
    task: MathTask,
    /// Number of records.
    len: usize,
    /// Which problems: record `i` is generated from `(seed, i)`.
    seed: u64,
}

impl Dataset for MathDataset {
    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, index: usize) -> Option<Record> {
        if index >= self.len {
            return None;
        }
        let rng = &mut seeded_rng([self.task.cfg.seed, DATASET_STREAM, self.seed, index as u64]);
        let p = self.task.generate(rng);
        let mut extra = Map::new();
        extra.insert("solution".into(), json!(p.solution));
        extra.insert("terms".into(), json!(p.terms));
        Some(Record {
            prompt: p.prompt,
            answer: p.answer,
            extra,
        })
    }
}

/// The math task as a single-turn environment: `reset(seed)` poses [`MathTask::problem`],
/// one `step` answers it (reward 1.0 or 0.0, always terminal).
#[derive(Debug, Clone)]
pub struct MathEnv {
    /// The generator.
    task: MathTask,
    /// Scores answers; strict, so only the `####` answer (or another explicit marker) counts.
    verifier: MathVerifier,
    /// The problem posed by the last `reset`, until it is answered.
    current: Option<Problem>,
    /// Whether any episode has started (to tell "before reset" from "after the end").
    started: bool,
}

impl MathEnv {
    /// An environment for the task `cfg` describes; invalid settings are
    /// [`EnvError::Config`] naming the field.
    pub fn new(cfg: MathTaskConfig) -> Result<MathEnv, EnvError> {
        Ok(MathEnv {
            task: MathTask::new(cfg)?,
            verifier: MathVerifier::strict(),
            current: None,
            started: false,
        })
    }

    /// The task behind the environment.
    pub fn task(&self) -> &MathTask {
        &self.task
    }
}

#[async_trait]
impl Env for MathEnv {
    async fn reset(&mut self, seed: u64) -> Result<Reset, EnvError> {
        let p = self.task.problem(seed);
        let mut info = Map::new();
        info.insert("terms".into(), json!(p.terms));
        let observation = p.prompt.clone();
        self.current = Some(p);
        self.started = true;
        Ok(Reset { observation, info })
    }

    /// Verification of a short response is microseconds of work, so it runs inline rather
    /// than on a blocking thread.
    async fn step(&mut self, action: &str) -> Result<Step, EnvError> {
        let Some(p) = self.current.take() else {
            return Err(crate::env::out_of_order("math", self.started));
        };
        let r = self.verifier.score(action, &p.answer);
        let mut info = Map::new();
        info.insert("answer".into(), json!(p.answer));
        info.insert("detail".into(), json!(r.detail));
        // The answer alone, format aside (the last number counts when `####` is missing):
        // tells arithmetic skill apart from format in what RL improves.
        let lenient = MathVerifier::default().score(action, &p.answer).value;
        info.insert("format_free".into(), json!(lenient));
        Ok(Step {
            observation: String::new(),
            reward: r.value,
            terminated: true,
            truncated: false,
            info,
        })
    }
}
