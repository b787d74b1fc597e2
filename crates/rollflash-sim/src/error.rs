//! The simulator's errors.

/// Why a simulation could not run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A setting is out of range; `field` is its path in the config.
    #[error("invalid sim config: {field}: {message}")]
    Config { field: String, message: String },
    /// Nothing left to happen before the last step: the configuration can never train.
    #[error("simulation stalled after {step} steps at t = {time_s:.3} s (nothing left to happen)")]
    Stalled { step: usize, time_s: f64 },
    #[error("simulation exceeded {0} events")]
    TooManyEvents(u64),
}
