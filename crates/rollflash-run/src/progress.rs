//! The training progress bar: step, samples/s and reward, drawn only when stdout is a
//! terminal (logs and test output stay clean).

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use rollflash_trainer::StepRecord;

/// A progress bar over the run's steps; invisible when stdout is not a terminal or when
/// turned off.
#[derive(Debug)]
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A bar for steps `done..total`.
    pub fn new(total: usize, done: usize, enabled: bool) -> Self {
        let target = if enabled && std::io::stdout().is_terminal() {
            ProgressDrawTarget::stdout()
        } else {
            ProgressDrawTarget::hidden()
        };
        let bar = ProgressBar::with_draw_target(Some(total as u64), target);
        // The template is a constant; should it ever fail to parse, the default style stays.
        if let Ok(style) = ProgressStyle::with_template(
            "{spinner} step {pos}/{len} [{bar:30}] {elapsed_precise} ETA {eta} {msg}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_position(done as u64);
        Progress { bar }
    }

    /// One step was published.
    pub fn step(&self, r: &StepRecord) {
        let sps = r.samples as f64 / r.wall.as_secs_f64().max(1e-9);
        self.bar.set_message(format!(
            "{sps:.1} samples/s  reward {:.3}  acc {:.2}",
            r.mean_reward, r.accuracy
        ));
        self.bar.set_position(r.step as u64 + 1);
    }

    /// Removes the bar (before the final summary is printed).
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
