//! Field checks shared by the sections (URLs, API keys, timeouts), each error naming the
//! field.

use super::{field, ConfigError};

pub(super) fn check_url(name: &str, url: &str) -> Result<(), ConfigError> {
    match url.strip_prefix("http://") {
        Some(rest) if !rest.trim_end_matches('/').is_empty() => Ok(()),
        _ => Err(field(
            name,
            format!("`{url}` is not an http:// URL (TLS is not built in)"),
        )),
    }
}

pub(super) fn check_key(
    section: &str,
    key: &Option<String>,
    key_env: &Option<String>,
) -> Result<(), ConfigError> {
    match (key, key_env) {
        (Some(_), Some(_)) => Err(field(
            &format!("{section}.api_key_env"),
            "set api_key or api_key_env, not both",
        )),
        (_, Some(v)) if v.is_empty() => Err(field(
            &format!("{section}.api_key_env"),
            "must not be empty",
        )),
        _ => Ok(()),
    }
}

pub(super) fn check_timeout(name: &str, secs: f64) -> Result<(), ConfigError> {
    if !(secs > 0.0) || !secs.is_finite() {
        return Err(field(name, "must be > 0"));
    }
    // A deadline is an `Instant` offset: one past a year is no bound a run needs, and a
    // huge one would overflow `Duration`/`Instant` arithmetic instead of failing here.
    if secs > MAX_TIMEOUT_SECS {
        return Err(field(name, "must be at most 3.2e7 (about a year)"));
    }
    Ok(())
}

/// The largest timeout accepted anywhere (about a year, in seconds).
pub(super) const MAX_TIMEOUT_SECS: f64 = 3.2e7;

/// Reads the API key a section names: inline, or from its environment variable (an unset
/// or empty variable is an error naming the field).
pub fn resolve_api_key(
    section: &str,
    key: &Option<String>,
    key_env: &Option<String>,
) -> Result<Option<String>, ConfigError> {
    match (key, key_env) {
        (Some(k), _) => Ok(Some(k.clone())),
        (None, Some(var)) => match std::env::var(var) {
            Ok(k) if !k.is_empty() => Ok(Some(k)),
            _ => Err(field(
                &format!("{section}.api_key_env"),
                format!("the environment variable `{var}` is not set"),
            )),
        },
        (None, None) => Ok(None),
    }
}
