//! The terminal of a run: progress bars with an ETA for its long phases (the warm-up, the RL steps, the
//! held-out evaluations) and the lines printed above them. Bars are drawn only when stdout
//! is a terminal and `metrics.progress` is on, so logs and test output stay clean.
//!
//! One [`MultiProgress`] per process, because there is one terminal: the bars and every
//! line written while they show (the binary's log writer, [`println`]) go through it, so a
//! line is printed above the bars instead of over them (indicatif clears the bars, the line
//! is written, the bars are redrawn).

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use rollflash_trainer::StepRecord;

/// The process's terminal: bars and the lines above them.
struct Terminal {
    multi: MultiProgress,
    /// `metrics.progress` of the run (on until a run says otherwise).
    enabled: AtomicBool,
}

fn terminal() -> &'static Terminal {
    static TERMINAL: OnceLock<Terminal> = OnceLock::new();
    TERMINAL.get_or_init(|| {
        let target = if std::io::stdout().is_terminal() {
            ProgressDrawTarget::stdout()
        } else {
            ProgressDrawTarget::hidden()
        };
        Terminal {
            multi: MultiProgress::with_draw_target(target),
            enabled: AtomicBool::new(true),
        }
    })
}

/// Turns bars on or off for what follows (`metrics.progress`).
pub fn set_enabled(on: bool) {
    terminal().enabled.store(on, Ordering::Relaxed);
}

/// Runs `f` with the bars cleared from the terminal and draws them again after: for
/// writing lines while a bar may show (the binary's log writer). Without a bar on screen
/// it only runs `f`.
pub fn suspend<R>(f: impl FnOnce() -> R) -> R {
    terminal().multi.suspend(f)
}

/// Prints `line` to stdout above the bars.
pub fn println(line: impl AsRef<str>) {
    let line = line.as_ref();
    suspend(|| println!("{line}"));
}

/// A bar of `total` units under `template` (an indicatif template), drawn when the
/// terminal shows bars, hidden otherwise.
fn bar(total: u64, template: &str) -> ProgressBar {
    let t = terminal();
    let bar = if t.enabled.load(Ordering::Relaxed) && !t.multi.is_hidden() {
        t.multi.add(ProgressBar::new(total))
    } else {
        ProgressBar::hidden()
    };
    bar.set_length(total);
    // The templates are constants; should one ever fail to parse, the default style stays.
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// A bar over one long phase (the warm-up, an evaluation), with its rate and ETA; cleared when dropped,
/// so a phase that ends by an error leaves no bar behind.
#[derive(Debug)]
pub struct PhaseBar {
    bar: ProgressBar,
}

impl PhaseBar {
    /// A bar named `what` over `total` units of `unit`.
    pub fn new(what: &str, total: u64, unit: &str) -> Self {
        let bar = bar(
            total,
            &format!(
                "{{spinner}} {what} {{pos}}/{{len}} {unit} [{{bar:30}}] {{elapsed_precise}} ETA {{eta}}"
            ),
        );
        PhaseBar { bar }
    }

    /// One more unit done.
    pub fn inc(&self) {
        self.bar.inc(1);
    }
}

impl Drop for PhaseBar {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}

/// The bar over the run's RL steps.
#[derive(Debug)]
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A bar for steps `done..total`; `enabled` is `metrics.progress`.
    pub fn new(total: usize, done: usize, enabled: bool) -> Self {
        set_enabled(enabled);
        let bar = bar(
            total as u64,
            "{spinner} step {pos}/{len} [{bar:30}] {elapsed_precise} ETA {eta} {msg}",
        );
        bar.set_position(done as u64);
        // The ETA from this process's steps only (a resumed run's earlier steps took no
        // time here).
        bar.reset_eta();
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
