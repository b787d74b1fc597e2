//! The sample buffer's decisions as a plain state machine: which groups may start
//! (admission), which finished groups are kept (filtering), which batch training gets
//! (consumption and staleness), and where every sample ended (accounting). No I/O and no
//! clock of its own: the async controller drives it with real rollouts, `rollflash sim`
//! with modelled ones.
//!
//! ## Versions and the asynchronous ratio α
//! The training step that starts from policy version `v` (and publishes `v + 1`) may use a
//! sample whose generation started under `v_start` only if `v_start >= v − ⌈α⌉`. α = 0 is
//! on-policy: only samples of the current weights. With a fractional α (say 0.5) the
//! oldest allowed version (`v − 1`) may supply at most `frac(α)` of the batch (ROLL's rule
//! for the oldest step's share).
//!
//! ## Admission (AReaL-style capacity)
//! A group may start at version `v` only while
//! `useful_started < (v + ⌊α⌋ + 1) · groups_per_batch + extra_groups`,
//! where `useful_started` counts groups started minus those that ended unusable (filtered,
//! failed, aborted, dropped). Since batches consume groups oldest-start first, a group
//! admitted under this bound is consumed within α steps: admission paces work instead of
//! starting what would be thrown away (the lesson of discard-and-requeue designs, which
//! starve slow, hard rollouts). `extra_groups` over-provisions for dynamic filtering.
//!
//! ## Accounting
//! Every started sample ends in exactly one of trained, filtered, dropped-stale, aborted or
//! failed; [`Accounting::balanced`] checks that the counts add up with what is still
//! running or buffered.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::PolicyVersion;

/// Identifies one group (one task's `n` samples) in the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct GroupKey(pub u64);

/// Which finished groups are dropped before training.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupFilter {
    /// Keep every complete group.
    #[default]
    None,
    /// Drop groups whose rewards are all equal: their group-relative advantages are zero,
    /// so they carry no gradient (ROLL's std filter, DAPO's dynamic sampling).
    ZeroVariance,
}

/// Settings of the buffer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BufferConfig {
    /// Groups in one training batch.
    pub groups_per_batch: usize,
    /// Samples kept per group.
    pub group_size: usize,
    /// The asynchronous ratio α (0 = on-policy). Fractional values limit the oldest
    /// allowed version's share of a batch.
    pub alpha: f64,
    /// Groups admitted beyond the α bound, to make up for filtered groups.
    pub extra_groups: usize,
    pub filter: GroupFilter,
    /// Synchronous baseline: admit nothing while a training step runs.
    pub barrier: bool,
}

impl Default for BufferConfig {
    fn default() -> Self {
        BufferConfig {
            groups_per_batch: 8,
            group_size: 8,
            alpha: 1.0,
            extra_groups: 0,
            filter: GroupFilter::None,
            barrier: false,
        }
    }
}

impl BufferConfig {
    /// Checks ranges; errors name the field.
    pub fn validate(&self) -> Result<(), BufferConfigError> {
        if self.groups_per_batch == 0 {
            return Err(BufferConfigError::NotPositive("groups_per_batch"));
        }
        if self.group_size == 0 {
            return Err(BufferConfigError::NotPositive("group_size"));
        }
        if !(self.alpha >= 0.0) || !self.alpha.is_finite() || self.alpha > 1e6 {
            return Err(BufferConfigError::Alpha(self.alpha));
        }
        Ok(())
    }

    /// ⌈α⌉: how many versions back a sample may have started.
    pub fn max_staleness(&self) -> u64 {
        self.alpha.ceil() as u64
    }

    /// How rollout and training overlap under these settings.
    pub fn schedule(&self) -> Schedule {
        if self.alpha == 0.0 && self.barrier {
            Schedule::Synchronous
        } else {
            Schedule::Async { alpha: self.alpha }
        }
    }

    /// These settings under `schedule`: the one place the synchronous baseline's rule lives
    /// (the run plan, the bench's modes and the simulator all come here).
    pub fn with_schedule(mut self, schedule: Schedule) -> Self {
        match schedule {
            Schedule::Synchronous => {
                self.alpha = 0.0;
                self.barrier = true;
            }
            Schedule::Async { alpha } => {
                self.alpha = alpha;
                self.barrier = false;
            }
        }
        self
    }
}

/// How rollout and training overlap.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Schedule {
    /// The synchronous baseline: α = 0 and nothing admitted while a step trains (the
    /// barrier), so every sample is generated by the policy it trains.
    Synchronous,
    /// Rollout goes on beside training; a sample starts at most ⌈α⌉ versions before the
    /// step that trains it (α = 0 without the barrier: on-policy, yet admission overlaps
    /// the step's training).
    Async { alpha: f64 },
}

impl Schedule {
    /// The synchronous baseline for α = 0, else asynchronous with `alpha`: how the bench
    /// names its modes.
    pub fn from_alpha(alpha: f64) -> Self {
        if alpha == 0.0 {
            Schedule::Synchronous
        } else {
            Schedule::Async { alpha }
        }
    }
}

/// A [`BufferConfig`] out of range; the message names the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BufferConfigError {
    #[error("buffer.{0} must be positive")]
    NotPositive(&'static str),
    #[error("buffer.alpha must be a finite number >= 0, got {0}")]
    Alpha(f64),
}

/// Where samples ended, cumulatively.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accounting {
    pub started: u64,
    pub trained: u64,
    pub filtered: u64,
    pub dropped_stale: u64,
    pub aborted: u64,
    pub failed: u64,
    /// Samples of groups still generating.
    pub running: u64,
    /// Samples of finished groups waiting for a batch.
    pub buffered: u64,
}

impl Accounting {
    /// Every started sample is in exactly one place.
    pub fn balanced(&self) -> bool {
        self.started
            == self.trained
                + self.filtered
                + self.dropped_stale
                + self.aborted
                + self.failed
                + self.running
                + self.buffered
    }
}

/// How a group's rollout ended, as the driver reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupOutcome<T> {
    /// The kept samples with their rewards (`group_size` of them for a complete group).
    pub samples: Vec<(T, f64)>,
    /// Samples started for this group but aborted (redundancy surplus, shutdown).
    pub aborted: u64,
    /// Samples that failed (environment or backend errors).
    pub failed: u64,
}

/// One whole group in a batch.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchGroup<T> {
    pub key: GroupKey,
    /// The version the group's generation started under.
    pub start: PolicyVersion,
    /// Its samples with their rewards.
    pub samples: Vec<(T, f64)>,
}

/// A batch for one training step.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch<T> {
    /// The version the step starts from.
    pub version: PolicyVersion,
    /// Whole groups, oldest start first.
    pub groups: Vec<BatchGroup<T>>,
}

impl<T> Batch<T> {
    /// Samples in the batch.
    pub fn len(&self) -> usize {
        self.groups.iter().map(|g| g.samples.len()).sum()
    }

    /// Whether the batch has no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Mean of (version − start version) over samples: how off-policy the batch is.
    pub fn mean_staleness(&self) -> f64 {
        let n = self.len();
        if n == 0 {
            return 0.0;
        }
        let s: u64 = self
            .groups
            .iter()
            .map(|g| (self.version.0.saturating_sub(g.start.0)) * g.samples.len() as u64)
            .sum();
        s as f64 / n as f64
    }
}

struct Finished<T> {
    start: PolicyVersion,
    samples: Vec<(T, f64)>,
}

/// The sample buffer state machine. `T` is whatever the driver stores per sample
/// (a trajectory; `()` in the simulator).
pub struct SampleBuffer<T> {
    cfg: BufferConfig,
    version: PolicyVersion,
    next_key: u64,
    /// Groups generating: key -> start version and samples started.
    running: BTreeMap<GroupKey, (PolicyVersion, u64)>,
    /// Finished, usable groups waiting for a batch, by key (= start order).
    ready: BTreeMap<GroupKey, Finished<T>>,
    /// Groups started and not (yet) known to be unusable.
    useful_started: u64,
    training: bool,
    acc: Accounting,
    /// Trained samples by staleness (version − start version).
    staleness: BTreeMap<u64, u64>,
}

impl<T> std::fmt::Debug for SampleBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SampleBuffer")
            .field("version", &self.version)
            .field("running", &self.running.len())
            .field("ready", &self.ready.len())
            .field("accounting", &self.acc)
            .finish()
    }
}

impl<T> SampleBuffer<T> {
    /// An empty buffer at version 0.
    pub fn new(cfg: BufferConfig) -> Self {
        SampleBuffer {
            cfg,
            version: PolicyVersion(0),
            next_key: 0,
            running: BTreeMap::new(),
            ready: BTreeMap::new(),
            useful_started: 0,
            training: false,
            acc: Accounting::default(),
            staleness: BTreeMap::new(),
        }
    }

    /// An empty buffer resuming a run at `version`, as if every earlier version had been
    /// trained on exactly one batch: the cumulative admission bound then admits the same
    /// work as the uninterrupted run would at that version (what `--resume` needs).
    pub fn starting_at(cfg: BufferConfig, version: PolicyVersion) -> Self {
        let useful_started = version.0 * cfg.groups_per_batch as u64;
        SampleBuffer {
            version,
            next_key: useful_started,
            useful_started,
            ..SampleBuffer::new(cfg)
        }
    }

    /// The configuration.
    pub fn config(&self) -> &BufferConfig {
        &self.cfg
    }

    /// The current policy version.
    pub fn version(&self) -> PolicyVersion {
        self.version
    }

    /// Where samples ended so far.
    pub fn accounting(&self) -> Accounting {
        self.acc
    }

    /// Trained samples by staleness (version − start version).
    pub fn staleness_histogram(&self) -> &BTreeMap<u64, u64> {
        &self.staleness
    }

    /// Groups generating now.
    pub fn running_groups(&self) -> usize {
        self.running.len()
    }

    /// Keys of the groups generating now.
    pub fn running_keys(&self) -> Vec<GroupKey> {
        self.running.keys().copied().collect()
    }

    /// Finished groups waiting for a batch.
    pub fn ready_groups(&self) -> usize {
        self.ready.len()
    }

    /// How many more groups may start now.
    pub fn admissible(&self) -> usize {
        if self.cfg.barrier && self.training {
            return 0;
        }
        let bound = ((self.version.0 as f64 + 1.0 + self.cfg.alpha)
            * self.cfg.groups_per_batch as f64)
            .floor() as u64
            + self.cfg.extra_groups as u64;
        bound.saturating_sub(self.useful_started) as usize
    }

    /// Admits one group of `samples` samples (`group_size` plus any redundancy) if the
    /// capacity allows; returns its key and start version.
    pub fn try_start(&mut self, samples: u64) -> Option<(GroupKey, PolicyVersion)> {
        if self.admissible() == 0 {
            return None;
        }
        let key = GroupKey(self.next_key);
        self.next_key += 1;
        self.useful_started += 1;
        self.running.insert(key, (self.version, samples));
        self.acc.started += samples;
        self.acc.running += samples;
        Some((key, self.version))
    }

    /// A group's rollout ended. A group with fewer than `group_size` kept samples cannot
    /// be trained on (group advantages need the whole group): its samples count as failed
    /// (or aborted when none failed). Unknown keys are ignored.
    pub fn finish(&mut self, key: GroupKey, outcome: GroupOutcome<T>) {
        let Some((start, started)) = self.running.remove(&key) else {
            return;
        };
        self.acc.running -= started;
        let kept = outcome.samples.len() as u64;
        // Whatever the driver did not report explicitly is aborted: the counts must add up
        // to what was started.
        let reported = kept + outcome.aborted + outcome.failed;
        let aborted = outcome.aborted + started.saturating_sub(reported);
        self.acc.aborted += aborted;
        self.acc.failed += outcome.failed;
        if outcome.samples.len() < self.cfg.group_size {
            self.useful_started -= 1;
            if outcome.failed > 0 {
                self.acc.failed += kept;
            } else {
                self.acc.aborted += kept;
            }
            return;
        }
        if self.cfg.filter == GroupFilter::ZeroVariance {
            let first = outcome.samples[0].1;
            if outcome.samples.iter().all(|s| s.1 == first) {
                self.useful_started -= 1;
                self.acc.filtered += kept;
                return;
            }
        }
        self.acc.buffered += kept;
        self.ready.insert(
            key,
            Finished {
                start,
                samples: outcome.samples,
            },
        );
    }

    /// Drops buffered groups too old for the step at the current version; returns how
    /// many samples were dropped.
    fn drop_stale(&mut self) -> u64 {
        let oldest = self.version.0.saturating_sub(self.cfg.max_staleness());
        let stale: Vec<GroupKey> = self
            .ready
            .iter()
            .filter(|(_, g)| g.start.0 < oldest)
            .map(|(k, _)| *k)
            .collect();
        let mut n = 0;
        for k in stale {
            if let Some(g) = self.ready.remove(&k) {
                let s = g.samples.len() as u64;
                self.acc.buffered -= s;
                self.acc.dropped_stale += s;
                self.useful_started -= 1;
                n += s;
            }
        }
        n
    }

    /// The batch for the step starting from the current version, if enough fresh groups
    /// are ready: `groups_per_batch` whole groups, oldest start first, with the oldest
    /// allowed version limited to `frac(α)` of the batch when α is fractional. Stale groups
    /// are dropped (and counted) first. Marks a step as running (see `barrier`).
    pub fn take_batch(&mut self) -> Option<Batch<T>> {
        self.drop_stale();
        let need = self.cfg.groups_per_batch;
        let oldest = self.version.0.saturating_sub(self.cfg.max_staleness());
        let frac = self.cfg.alpha - self.cfg.alpha.floor();
        // Groups from the oldest allowed version are capped when α is fractional (and
        // α > 0 makes an older version allowed at all).
        let cap_oldest = if frac > 0.0 && self.cfg.max_staleness() > 0 {
            (frac * need as f64).floor() as usize
        } else {
            need
        };
        let mut chosen = Vec::with_capacity(need);
        let mut from_oldest = 0;
        for (k, g) in &self.ready {
            if chosen.len() == need {
                break;
            }
            if g.start.0 == oldest && oldest < self.version.0 {
                if from_oldest == cap_oldest {
                    continue;
                }
                from_oldest += 1;
            }
            chosen.push(*k);
        }
        if chosen.len() < need {
            return None;
        }
        let mut groups = Vec::with_capacity(need);
        for k in chosen {
            if let Some(g) = self.ready.remove(&k) {
                let n = g.samples.len() as u64;
                self.acc.buffered -= n;
                self.acc.trained += n;
                *self
                    .staleness
                    .entry(self.version.0 - g.start.0)
                    .or_default() += n;
                groups.push(BatchGroup {
                    key: k,
                    start: g.start,
                    samples: g.samples,
                });
            }
        }
        // Trained groups stay in `useful_started`: the bound is cumulative and grows by one
        // batch per published version.
        self.training = true;
        Some(Batch {
            version: self.version,
            groups,
        })
    }

    /// The step that started from the current version published `version`.
    pub fn publish(&mut self, version: PolicyVersion) {
        self.version = version;
        self.training = false;
        self.drop_stale();
    }

    /// Stops: every buffered sample is counted aborted; running groups are reported by
    /// the driver through `finish` as they end.
    pub fn shutdown(&mut self) {
        let keys: Vec<GroupKey> = self.ready.keys().copied().collect();
        for k in keys {
            if let Some(g) = self.ready.remove(&k) {
                let n = g.samples.len() as u64;
                self.acc.buffered -= n;
                self.acc.aborted += n;
            }
        }
    }
}
