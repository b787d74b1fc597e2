//! Redundant environment rollout as a plain decision: a group starts `group_size + redundancy`
//! trajectories, keeps the first `group_size` that end usable and aborts the rest. The async
//! `EnvManager::run_group` feeds it the trajectories as they finish; `rollflash sim` feeds it
//! modelled ones. Keeping the rule here means both count the same way.

/// How one member trajectory of a group ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberEnd {
    /// Finished usable (terminated, truncated or hit a limit): it may be kept.
    Usable,
    /// Failed (environment or backend error, timeout).
    Failed,
    /// Aborted before it finished (shutdown).
    Aborted,
}

/// What the group should do after a member ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupDecision {
    /// Wait for more members.
    Wait,
    /// The group is over. `abort` members are still running and must be aborted (the
    /// redundancy surplus once `group_size` were kept; 0 when every member ended).
    Done { abort: usize },
}

/// The progress of one group. See the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupProgress {
    group_size: usize,
    members: usize,
    kept: usize,
    failed: usize,
    aborted: usize,
    done: bool,
}

impl GroupProgress {
    /// A group that keeps `group_size` of `group_size + redundancy` members.
    pub fn new(group_size: usize, redundancy: usize) -> Self {
        GroupProgress {
            group_size,
            members: group_size + redundancy,
            kept: 0,
            failed: 0,
            aborted: 0,
            done: false,
        }
    }

    /// Members to start.
    pub fn members(&self) -> usize {
        self.members
    }

    /// Members still running.
    pub fn running(&self) -> usize {
        self.members - self.kept - self.failed - self.aborted
    }

    /// Members kept so far.
    pub fn kept(&self) -> usize {
        self.kept
    }

    /// Members that failed.
    pub fn failed(&self) -> usize {
        self.failed
    }

    /// Members aborted (including the surplus once the group was done).
    pub fn aborted(&self) -> usize {
        self.aborted
    }

    /// Whether the group is over.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Whether the group kept `group_size` members (else it cannot be trained on).
    pub fn is_complete(&self) -> bool {
        self.kept == self.group_size
    }

    /// Records how one member ended. Once the group is done, later reports are ignored
    /// (the surplus was already counted as aborted).
    pub fn record(&mut self, end: MemberEnd) -> GroupDecision {
        if self.done || self.running() == 0 {
            return GroupDecision::Done { abort: 0 };
        }
        match end {
            MemberEnd::Usable => self.kept += 1,
            MemberEnd::Failed => self.failed += 1,
            MemberEnd::Aborted => self.aborted += 1,
        }
        if self.kept == self.group_size || self.running() == 0 {
            let abort = self.running();
            self.aborted += abort;
            self.done = true;
            return GroupDecision::Done { abort };
        }
        GroupDecision::Wait
    }
}
