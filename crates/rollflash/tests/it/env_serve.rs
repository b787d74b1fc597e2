//! `rollflash env-serve` as a real process.
