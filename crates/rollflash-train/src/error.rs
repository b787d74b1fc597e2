//! The one error type of the train crate: what went wrong, with the field, input or sequence
//! named, so a bad config or a mis-packed batch is found from the message alone.

/// Everything that can fail in `rollflash-train`.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A tensor operation failed inside candle (device mismatch, unsupported dtype, ...).
    #[error("tensor operation failed")]
    Tensor(#[from] candle_core::Error),

    /// A configuration value is out of range or inconsistent with another one.
    #[error("invalid config field `{field}`: {reason}")]
    Config {
        /// Dotted path of the offending field, e.g. `correction.is_weight.upper_bound`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A configuration did not parse.
    #[error("invalid config JSON")]
    Json(#[source] serde_json::Error),

    /// An input has the wrong length (or rank) for the batch it belongs to.
    #[error("input `{name}` has length {got}, expected {expected}")]
    Length {
        /// Which input: `logp`, `mask`, `rewards`, `group_sizes`, ...
        name: &'static str,
        /// The length the rest of the batch implies.
        expected: usize,
        /// The length it has.
        got: usize,
    },

    /// A tensor input is not one-dimensional; every per-token input is packed into `[tokens]`.
    #[error("input `{name}` must be 1-D `[tokens]`, got shape {shape:?}")]
    Rank {
        /// Which input.
        name: &'static str,
        /// Its shape.
        shape: Vec<usize>,
    },

    /// Sequence offsets do not describe a packing of the tokens.
    #[error("invalid sequence layout: {reason}")]
    Layout {
        /// What is wrong (first offset not 0, decreasing, past the end, ...).
        reason: String,
    },

    /// Group sizes do not partition the sequences.
    #[error("invalid groups: {reason}")]
    Groups {
        /// What is wrong (sizes do not add up, an empty group, ...).
        reason: String,
    },

    /// An input needed by the configuration was not given.
    #[error("input `{name}` is required because {because}")]
    MissingInput {
        /// Which input: `ref_logp`, `entropy`, `kl`, ...
        name: &'static str,
        /// The config setting that needs it.
        because: &'static str,
    },

    /// A batch with no tokens at all: there is nothing to take a mean over.
    #[error("empty batch: no tokens")]
    EmptyBatch,
}

/// Shorthand used throughout the crate.
pub type Result<T, E = TrainError> = std::result::Result<T, E>;

impl TrainError {
    /// A [`TrainError::Config`] for `field`.
    pub(crate) fn config(field: impl Into<String>, reason: impl Into<String>) -> Self {
        TrainError::Config {
            field: field.into(),
            reason: reason.into(),
        }
    }
}
