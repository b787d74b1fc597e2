//! What a simulation reports: per-step records like `rollflash train`'s `metrics.jsonl`,
//! and run totals (throughput, utilisation, staleness, accounting).

use rollflash_core::buffer::Accounting;
use rollflash_core::proxy::ProxyCounters;

/// One training step, as the real controller's `StepRecord` has it.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRecord {
    pub step: usize,
    /// The version the step trained from.
    pub version: u64,
    pub samples: usize,
    /// Model tokens trained on.
    pub response_tokens: u64,
    /// All tokens the trainer processed (prompts, responses, observations).
    pub seq_tokens: u64,
    pub mean_reward: f64,
    /// Mean (version − start version) over the batch.
    pub staleness: f64,
    /// Largest (version − start version) in the batch.
    pub staleness_max: u64,
    /// From the previous publication (or the start) to this one.
    pub wall_s: f64,
    pub train_s: f64,
    /// The trainer waited this long for the batch.
    pub wait_s: f64,
    /// Pause + update + resume.
    pub sync_s: f64,
    /// Virtual time at the publication.
    pub end_s: f64,
    pub accounting: Accounting,
}

/// A whole simulated run.
#[derive(Debug, Clone, PartialEq)]
pub struct SimReport {
    pub steps: Vec<StepRecord>,
    pub accounting: Accounting,
    /// Virtual seconds from the start to the last publication.
    pub wall_s: f64,
    pub trained_samples: u64,
    pub trained_response_tokens: u64,
    /// Trained samples by staleness.
    pub staleness: Vec<(u64, u64)>,
    /// Fraction of worker-time spent stepping.
    pub rollout_util: f64,
    /// Fraction of the run the trainer was busy.
    pub train_util: f64,
    /// Seconds during which generation and training ran at the same time.
    pub gen_train_overlap_s: f64,
    /// Tokens decoded, including those of aborted and discarded work.
    pub decode_tokens: u64,
    pub proxy: ProxyCounters,
    /// Events processed (a measure of the simulation's own cost).
    pub events: u64,
}

impl SimReport {
    /// Trained samples per virtual second over the whole run.
    pub fn samples_per_s(&self) -> f64 {
        self.trained_samples as f64 / self.wall_s.max(1e-12)
    }

    /// Trained model tokens per virtual second over the whole run.
    pub fn tokens_per_s(&self) -> f64 {
        self.trained_response_tokens as f64 / self.wall_s.max(1e-12)
    }

    /// Trained samples per second after the first `skip` steps (steady state: without
    /// the pipeline filling up).
    pub fn steady_samples_per_s(&self, skip: usize) -> f64 {
        if self.steps.len() <= skip {
            return self.samples_per_s();
        }
        let t0 = if skip == 0 {
            0.0
        } else {
            self.steps[skip - 1].end_s
        };
        let n: usize = self.steps[skip..].iter().map(|s| s.samples).sum();
        n as f64 / (self.wall_s - t0).max(1e-12)
    }

    /// The largest staleness of any trained sample.
    pub fn max_staleness(&self) -> u64 {
        self.steps
            .iter()
            .map(|s| s.staleness_max)
            .max()
            .unwrap_or(0)
    }
}
