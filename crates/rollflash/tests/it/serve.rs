//! `rollflash serve` as a real process, driven through the HTTP backends.
