//! `env`: where trajectories' environments come from (built-in, a `rollflash env-serve`
//! server, or an OpenEnv server), and its TOML shape.

use rollflash_env::envs::EnvSpec;
use serde::{Deserialize, Serialize};

use super::check::{check_key, check_timeout, check_url};
use super::{field, ConfigError};

/// The keys that make `env` another source than a built-in environment.
pub(super) const ENV_SOURCE_KEYS: [&str; 2] = ["remote", "openenv"];

/// `env`: where trajectories' environments come from. In TOML, a built-in environment's
/// spec (`[env]` with `name = "math"` and its fields), or one key naming another source:
/// `[env.remote]` (a `rollflash env-serve` server) or `[env.openenv]` (an OpenEnv server).
#[derive(Debug, Clone, PartialEq)]
pub enum EnvSection {
    /// A built-in environment in this process.
    Builtin(EnvSpec),
    /// The spec built by a `rollflash env-serve` server.
    Remote(RemoteEnvSection),
    /// An environment on an OpenEnv server.
    OpenEnv(OpenEnvSection),
}

/// `[env.remote]`: an environment on a `rollflash env-serve` server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteEnvSection {
    /// The server, e.g. `http://127.0.0.1:8123`.
    pub url: String,
    /// The server's API key (prefer `api_key_env`: a key in a config file gets copied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// The environment variable that holds the API key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Deadline of each request (create, reset, step, delete, the start-up check).
    #[serde(default = "default_env_timeout")]
    pub timeout_secs: f64,
    /// The environment the server builds, as a built-in `[env]` would be written.
    pub spec: EnvSpec,
}

/// `[env.openenv]`: an environment on an OpenEnv server (see `rollflash_env::openenv` for
/// how its actions and observations map to text).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenEnvSection {
    /// The server, `http://host:port`.
    pub url: String,
    /// Sent as a bearer token (OpenEnv has no auth itself; a gateway in front may).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// The environment variable that holds the API key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Deadline of each request and session message.
    #[serde(default = "default_env_timeout")]
    pub timeout_secs: f64,
    /// The action's string field the model's text goes into (default: the only one in the
    /// server's action schema).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action_field: Option<String>,
    /// Fixed fields sent with every action.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub action_extra: serde_json::Map<String, serde_json::Value>,
    /// The observation field shown to the model (default: the only string field, else the
    /// whole observation as JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observation_field: Option<String>,
    /// Extra fields of every reset besides `seed`.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub reset_extra: serde_json::Map<String, serde_json::Value>,
    /// The episode reward at or above which a sample counts as a success (accuracy).
    #[serde(default = "default_success_reward")]
    pub success_reward: f64,
}

fn default_success_reward() -> f64 {
    1.0
}

fn default_env_timeout() -> f64 {
    30.0
}

impl EnvSection {
    /// The environment's name: the built-in's (or the one the remote server builds), or
    /// `openenv`.
    pub fn name(&self) -> &'static str {
        match self {
            EnvSection::Builtin(s) => s.name(),
            EnvSection::Remote(r) => r.spec.name(),
            EnvSection::OpenEnv(_) => "openenv",
        }
    }

    /// The spec of the tasks, when rollflash knows it (a built-in, or what a remote
    /// `env-serve` builds); `None` for OpenEnv.
    pub fn spec(&self) -> Option<&EnvSpec> {
        match self {
            EnvSection::Builtin(s) => Some(s),
            EnvSection::Remote(r) => Some(&r.spec),
            EnvSection::OpenEnv(_) => None,
        }
    }

    /// Checks ranges and consistency; errors name the field (`env.remote.url`, …).
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self {
            EnvSection::Builtin(s) => s.validate().map_err(ConfigError::Env),
            EnvSection::Remote(r) => {
                check_url("env.remote.url", &r.url)?;
                check_key("env.remote", &r.api_key, &r.api_key_env)?;
                check_timeout("env.remote.timeout_secs", r.timeout_secs)?;
                r.spec.validate().map_err(|e| match e {
                    rollflash_env::EnvError::Config { field, reason } => {
                        self::field(&format!("env.remote.spec.{field}"), reason)
                    }
                    other => ConfigError::Env(other),
                })
            }
            EnvSection::OpenEnv(o) => {
                check_key("env.openenv", &o.api_key, &o.api_key_env)?;
                if !o.success_reward.is_finite() {
                    return Err(field("env.openenv.success_reward", "must be finite"));
                }
                // The client's own checks, with its field names under `env.openenv`.
                o.client_config(None).validate().map_err(|e| match e {
                    rollflash_env::EnvError::Config { field, reason } => {
                        self::field(&format!("env.openenv.{field}"), reason)
                    }
                    other => ConfigError::Env(other),
                })
            }
        }
    }
}

impl OpenEnvSection {
    /// The client's configuration, with the resolved API key.
    pub fn client_config(&self, api_key: Option<String>) -> rollflash_env::openenv::OpenEnvConfig {
        rollflash_env::openenv::OpenEnvConfig {
            url: self.url.clone(),
            api_key,
            timeout_secs: self.timeout_secs,
            action_field: self.action_field.clone(),
            action_extra: self.action_extra.clone(),
            observation_field: self.observation_field.clone(),
            reset_extra: self.reset_extra.clone(),
        }
    }
}

impl Serialize for EnvSection {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        #[serde(untagged)]
        enum Wire<'a> {
            Builtin(&'a EnvSpec),
            Remote { remote: &'a RemoteEnvSection },
            OpenEnv { openenv: &'a OpenEnvSection },
        }
        match self {
            EnvSection::Builtin(spec) => Wire::Builtin(spec),
            EnvSection::Remote(remote) => Wire::Remote { remote },
            EnvSection::OpenEnv(openenv) => Wire::OpenEnv { openenv },
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for EnvSection {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let value = toml::Value::deserialize(d)?;
        let source = value.as_table().and_then(|t| {
            ENV_SOURCE_KEYS
                .iter()
                .find(|k| t.contains_key(**k))
                .map(|k| (*k, t))
        });
        let Some((key, table)) = source else {
            return EnvSpec::deserialize(value)
                .map(EnvSection::Builtin)
                .map_err(D::Error::custom);
        };
        if table.len() > 1 {
            let others: Vec<&str> = table
                .keys()
                .map(String::as_str)
                .filter(|k| *k != key)
                .collect();
            return Err(D::Error::custom(format!(
                "`{key}` is the whole environment; `{}` belongs in `{key}.spec` or nowhere",
                others.join("`, `")
            )));
        }
        let inner = table
            .get(key)
            .cloned()
            .unwrap_or(toml::Value::Table(Default::default()));
        // Nested paths in the message: serde_path_to_error stops at `env` here.
        fn sub<T: serde::de::DeserializeOwned>(key: &str, v: toml::Value) -> Result<T, String> {
            serde_path_to_error::deserialize(v).map_err(|e| {
                let path = e.path().to_string();
                let inner = e.into_inner();
                if path == "." {
                    format!("{key}: {inner}")
                } else {
                    format!("{key}.{path}: {inner}")
                }
            })
        }
        match key {
            "remote" => sub(key, inner).map(EnvSection::Remote),
            _ => sub(key, inner).map(EnvSection::OpenEnv),
        }
        .map_err(D::Error::custom)
    }
}
