//! The routing policies of the proxy scheduler: what a policy sees of a backend
//! ([`BackendView`]), the [`RoutingPolicy`] trait, its three implementations (`RoundRobin`,
//! `LeastLoaded`, `Sticky`) and the [`Routing`] names configs use to pick one.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::{Affinity, BackendId};

/// What a routing policy sees of one backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendView {
    pub id: BackendId,
    pub running: usize,
    pub capacity: usize,
    pub healthy: bool,
}

impl BackendView {
    /// Whether it can take one more request now.
    pub fn has_room(&self) -> bool {
        self.healthy && self.running < self.capacity
    }
}

/// Picks a backend for a request among `backends` (all of them, in id order; some may be
/// full or unhealthy). Returning `None` means "not now": the request keeps its place in the
/// queue and later requests may go first.
pub trait RoutingPolicy: Send {
    /// The policy's name in configs and metrics.
    fn name(&self) -> &'static str;
    /// Chooses a backend with room, or `None` to wait.
    fn select(&mut self, affinity: Affinity, backends: &[BackendView]) -> Option<BackendId>;
    /// The trajectory behind a sticky key ended; its next request may go anywhere.
    fn forget(&mut self, _key: u64) {}
}

/// Cycles through the backends with room.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: usize,
}

impl RoutingPolicy for RoundRobin {
    fn name(&self) -> &'static str {
        "round_robin"
    }
    fn select(&mut self, _affinity: Affinity, backends: &[BackendView]) -> Option<BackendId> {
        let n = backends.len();
        (0..n)
            .map(|k| (self.next + k) % n)
            .find(|&i| backends[i].has_room())
            .map(|i| {
                self.next = (i + 1) % n;
                backends[i].id
            })
    }
}

/// The backend with the lowest fraction of its capacity in use (ties: lowest id).
#[derive(Debug, Default)]
pub struct LeastLoaded;

fn least_loaded(backends: &[BackendView]) -> Option<BackendId> {
    backends
        .iter()
        .filter(|b| b.has_room())
        // running/capacity compared without division: a/b < c/d  <=>  a*d < c*b.
        .min_by(|a, b| (a.running * b.capacity).cmp(&(b.running * a.capacity)))
        .map(|b| b.id)
}

impl RoutingPolicy for LeastLoaded {
    fn name(&self) -> &'static str {
        "least_loaded"
    }
    fn select(&mut self, _affinity: Affinity, backends: &[BackendView]) -> Option<BackendId> {
        least_loaded(backends)
    }
}

/// Sticky per trajectory: requests with the same `Affinity::Sticky` key go to the same
/// backend (least loaded for the first one), so a multi-turn episode reuses its prefix; a
/// request waits for its backend when that is full, and moves only if it became unhealthy.
/// Requests without a key are routed least-loaded. Keys are remembered until
/// [`RoutingPolicy::forget`] (the trajectory ended); at most `MAX_KEYS` are kept.
#[derive(Debug, Default)]
pub struct Sticky {
    homes: HashMap<u64, BackendId>,
}

impl Sticky {
    /// Bound on remembered keys, so a driver that never forgets cannot grow memory forever.
    pub const MAX_KEYS: usize = 1 << 20;

    /// Keys currently remembered.
    pub fn live_keys(&self) -> usize {
        self.homes.len()
    }
}

impl RoutingPolicy for Sticky {
    fn name(&self) -> &'static str {
        "sticky"
    }
    fn select(&mut self, affinity: Affinity, backends: &[BackendView]) -> Option<BackendId> {
        let Affinity::Sticky(key) = affinity else {
            return least_loaded(backends);
        };
        if let Some(home) = self.homes.get(&key) {
            if let Some(b) = backends.iter().find(|b| b.id == *home) {
                if b.healthy {
                    return b.has_room().then_some(*home);
                }
            }
        }
        let chosen = least_loaded(backends)?;
        if self.homes.len() >= Self::MAX_KEYS {
            self.homes.clear();
        }
        self.homes.insert(key, chosen);
        Some(chosen)
    }
    fn forget(&mut self, key: u64) {
        self.homes.remove(&key);
    }
}

/// The routing policies by name, as configs write them (`least_loaded`, `round_robin`,
/// `sticky`). Parsed once, by serde, where the config is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Routing {
    RoundRobin,
    #[default]
    LeastLoaded,
    Sticky,
}

impl Routing {
    /// A fresh policy of this kind.
    pub fn policy(self) -> Box<dyn RoutingPolicy> {
        match self {
            Routing::RoundRobin => Box::new(RoundRobin::default()),
            Routing::LeastLoaded => Box::new(LeastLoaded),
            Routing::Sticky => Box::new(Sticky::default()),
        }
    }

    /// The policy a config name stands for (tests and command lines; configs go through
    /// serde).
    pub fn from_name(name: &str) -> Option<Routing> {
        match name {
            "round_robin" => Some(Routing::RoundRobin),
            "least_loaded" => Some(Routing::LeastLoaded),
            "sticky" => Some(Routing::Sticky),
            _ => None,
        }
    }
}
