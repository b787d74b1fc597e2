//! A thread count as the user writes it: a number they pinned, or `"auto"` for the plan's
//! core split (`crate::cores`).

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `train.threads` and `rollout.engine_threads`: a positive number, or `"auto"` (the
/// default), which the plan resolves from the machine's cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Threads {
    /// Decided by the plan ([`crate::cores::CoreSplit`]).
    #[default]
    Auto,
    /// Exactly this many (validation refuses 0).
    Fixed(usize),
}

impl Serialize for Threads {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Threads::Auto => s.serialize_str("auto"),
            Threads::Fixed(n) => s.serialize_u64(*n as u64),
        }
    }
}

impl<'de> Deserialize<'de> for Threads {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Count(usize),
            Word(String),
        }
        match Written::deserialize(d) {
            Ok(Written::Count(n)) => Ok(Threads::Fixed(n)),
            Ok(Written::Word(w)) if w == "auto" => Ok(Threads::Auto),
            _ => Err(serde::de::Error::custom(
                "expected a thread count (a positive integer) or \"auto\"",
            )),
        }
    }
}

impl From<usize> for Threads {
    fn from(n: usize) -> Self {
        Threads::Fixed(n)
    }
}
