//! How a run's CPU cores are divided between the rollout engines and the trainer: the one
//! rule behind `train.threads = "auto"` and `rollout.engine_threads = "auto"`.
//!
//! The automatic split gives each side every core (the engines share them among
//! themselves) and lets the operating system divide them while both run. ROLL Flash sizes
//! rollout against training from the two phases' costs; on a CPU the costs move within a
//! step (generation waits on the trainer at α, the trainer waits on a batch), so a fixed
//! division leaves the idle side's cores unused. Shared, a side that waits leaves its cores
//! to the side that works, and while both work each gets about its share of runnable
//! threads. Measured on SmolLM2-135M on 2 cores (training about 70 % of a step): pinned 1 + 1
//! made α = 1 0.81× the synchronous baseline, shared 2 + 2 1.18× (BENCHMARKS.md, issue 35).
//! In the synchronous baseline the phases alternate, so each gets every core either way.
//! The trainer's arithmetic does not depend on its thread count (the synchronous baseline
//! repeats byte for byte at any count), so the choice changes speed, not results.

use crate::config::Threads;

/// The threads each side of a run gets, and how they were chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoreSplit {
    /// The cores this process may use (`std::thread::available_parallelism`: affinity and
    /// cgroup quotas included).
    pub cores: usize,
    /// Embedded engines the rollout threads are for (0: the rollout runs elsewhere).
    pub engines: usize,
    /// Threads of each embedded engine.
    pub engine_threads: usize,
    /// Threads of the trainer.
    pub train_threads: usize,
    engine_auto: bool,
    train_auto: bool,
}

impl CoreSplit {
    /// The split for `cores` cores and `engines` embedded engines, from the two settings.
    pub fn new(cores: usize, engines: usize, engine: Threads, train: Threads) -> Self {
        let cores = cores.max(1);
        let (engine_threads, engine_auto) = match engine {
            Threads::Auto => ((cores / engines.max(1)).max(1), true),
            Threads::Fixed(n) => (n.max(1), false),
        };
        let (train_threads, train_auto) = match train {
            Threads::Auto => (cores, true),
            Threads::Fixed(n) => (n.max(1), false),
        };
        CoreSplit {
            cores,
            engines,
            engine_threads,
            train_threads,
            engine_auto,
            train_auto,
        }
    }

    /// [`CoreSplit::new`] on this machine's cores.
    pub fn detect(engines: usize, engine: Threads, train: Threads) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::new(cores, engines, engine, train)
    }

    /// Threads of every engine together.
    pub fn rollout_threads(&self) -> usize {
        self.engines * self.engine_threads
    }

    /// Threads of the supervised warm-up, which runs before either side: all the run's
    /// threads, but no more than the cores (a pool larger than the machine only makes its
    /// threads wait on each other).
    pub fn warmup_threads(&self) -> usize {
        (self.train_threads + self.rollout_threads())
            .min(self.cores)
            .max(1)
    }

    /// Whether both sides' threads together exceed the cores, so that the operating system
    /// shares them while both run.
    pub fn shared(&self) -> bool {
        self.engines > 0 && self.train_threads + self.rollout_threads() > self.cores
    }

    /// One line for the banner and `--dry-run`: what was chosen and why.
    pub fn describe(&self, sync: bool) -> String {
        let how = |auto: bool| if auto { "auto" } else { "pinned" };
        let rollout = if self.engines == 0 {
            "no embedded engine (the rollout servers' threads are their own)".to_string()
        } else {
            format!(
                "{} engine(s) × {} thread(s) ({})",
                self.engines,
                self.engine_threads,
                how(self.engine_auto)
            )
        };
        let why = if self.engines == 0 {
            "the trainer is alone on this machine"
        } else if sync {
            "synchronous: the phases alternate, each with its own threads"
        } else if self.shared() {
            "asynchronous: both sides run at once and the OS shares the cores, so a side \
             that waits leaves its cores to the one that works"
        } else {
            "asynchronous: the sides' threads fit the cores side by side"
        };
        format!(
            "cores: {} available; trainer {} thread(s) ({}), {rollout}; {why}",
            self.cores,
            self.train_threads,
            how(self.train_auto)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_gives_each_side_every_core() {
        let s = CoreSplit::new(2, 1, Threads::Auto, Threads::Auto);
        assert_eq!((s.engine_threads, s.train_threads), (2, 2));
        assert!(s.shared());
        assert_eq!(s.warmup_threads(), 2);
        let s = CoreSplit::new(2, 2, Threads::Auto, Threads::Auto);
        assert_eq!(
            (s.engine_threads, s.rollout_threads(), s.train_threads),
            (1, 2, 2)
        );
        let s = CoreSplit::new(1, 3, Threads::Auto, Threads::Auto);
        assert_eq!((s.engine_threads, s.train_threads), (1, 1));
    }

    #[test]
    fn pinned_counts_are_kept() {
        let s = CoreSplit::new(16, 1, Threads::Fixed(1), Threads::Fixed(1));
        assert_eq!((s.engine_threads, s.train_threads), (1, 1));
        assert!(!s.shared());
        assert_eq!(s.warmup_threads(), 2);
        assert!(s.describe(false).contains("pinned"));
        let s = CoreSplit::new(2, 1, Threads::Fixed(4), Threads::Auto);
        assert_eq!(
            (s.engine_threads, s.train_threads, s.warmup_threads()),
            (4, 2, 2)
        );
    }
}
