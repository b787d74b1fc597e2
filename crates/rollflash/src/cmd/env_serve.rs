//! `rollflash env-serve`: a built-in environment behind the remote-environment HTTP protocol.
//!
//! Runs [`rollflash_env::remote::serve`] until Ctrl-C or SIGTERM. The first line on stdout is
//! `listening on http://HOST:PORT`, so scripts and tests that ask for port 0 learn the port
//! the OS picked; logs go to stderr.

use std::io::Write;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rollflash_env::envs::ENV_NAMES;
use rollflash_env::remote::{serve, EnvServerConfig};
use rollflash_env::verify::python::{PythonPool, PythonPoolConfig};

/// Environment variable read for the API key when `--api-key` is not given (keeps the key
/// out of `ps` output).
const API_KEY_VAR: &str = "ROLLFLASH_API_KEY";

/// How long a shutdown waits for requests in flight.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Arguments of `rollflash env-serve`.
#[derive(clap::Args)]
pub struct EnvServeArgs {
    /// Address to bind. Loopback by default: environments run whatever clients ask for, so
    /// exposing them is a deliberate choice (and then pair it with an API key).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to bind; 0 lets the OS pick (the chosen one is printed).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Require `Authorization: Bearer <KEY>` (default: $ROLLFLASH_API_KEY, if set).
    #[arg(long)]
    api_key: Option<String>,
    /// Most live environments at once.
    #[arg(long, default_value_t = 1024)]
    max_envs: usize,
    /// Drop environments unused for this many seconds (checked when one is created).
    #[arg(long)]
    idle_timeout_secs: Option<f64>,
    /// Serve only these environments (repeatable; default: all built-ins).
    #[arg(long = "env", value_name = "NAME")]
    envs: Vec<String>,
    /// Score dataset specs whose reward is a Python function (`reward = { python = … }`)
    /// with this interpreter (a venv's `bin/python` gives the functions its packages): a
    /// pool of long-lived workers, as `[reward.python]` in `rollflash train`.
    #[arg(long, value_name = "PYTHON")]
    reward_python: Option<std::path::PathBuf>,
    /// Python reward workers (with --reward-python).
    #[arg(long, default_value_t = 2, requires = "reward_python")]
    reward_workers: usize,
    /// Deadline of one Python reward call, in seconds (with --reward-python).
    #[arg(long, default_value_t = 30.0, requires = "reward_python")]
    reward_timeout_secs: f64,
}

// By hand, so the API key never reaches a log.
impl std::fmt::Debug for EnvServeArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnvServeArgs")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("max_envs", &self.max_envs)
            .field("idle_timeout_secs", &self.idle_timeout_secs)
            .field("envs", &self.envs)
            .field("reward_python", &self.reward_python)
            .field("reward_workers", &self.reward_workers)
            .field("reward_timeout_secs", &self.reward_timeout_secs)
            .finish()
    }
}

impl EnvServeArgs {
    /// The Python reward pool's settings these flags describe, checked; `None` without
    /// `--reward-python`.
    fn python(&self) -> Result<Option<PythonPoolConfig>> {
        let Some(python) = &self.reward_python else {
            return Ok(None);
        };
        let cfg = PythonPoolConfig {
            python: python.clone(),
            workers: self.reward_workers,
            timeout_secs: self.reward_timeout_secs,
            ..PythonPoolConfig::default()
        };
        cfg.validate().map_err(|e| {
            // The pool names its field as `[reward.python]` spells it; here it is a flag.
            let flag = match e.field {
                "workers" => "--reward-workers",
                "timeout_secs" => "--reward-timeout-secs",
                _ => "--reward-python",
            };
            anyhow::anyhow!("{flag}: {}", e.reason)
        })?;
        Ok(Some(cfg))
    }

    /// The server configuration these flags describe (without its Python pool, which
    /// [`run`] starts).
    fn config(&self) -> Result<EnvServerConfig> {
        for name in &self.envs {
            if !ENV_NAMES.contains(&name.as_str()) {
                bail!(
                    "--env {name}: unknown environment (built-ins: {})",
                    ENV_NAMES.join(", ")
                );
            }
        }
        if self.max_envs == 0 {
            bail!("--max-envs must be at least 1");
        }
        let idle_timeout = match self.idle_timeout_secs {
            Some(s) => Some(
                Duration::try_from_secs_f64(s)
                    .with_context(|| format!("--idle-timeout-secs {s}"))?,
            ),
            None => None,
        };
        let api_key = self
            .api_key
            .clone()
            .or_else(|| std::env::var(API_KEY_VAR).ok())
            .filter(|k| !k.is_empty());
        Ok(EnvServerConfig {
            api_key,
            max_envs: self.max_envs,
            idle_timeout,
            allowed_envs: (!self.envs.is_empty()).then(|| self.envs.clone()),
            ..EnvServerConfig::default()
        })
    }
}

/// Runs the server until Ctrl-C or SIGTERM.
pub fn run(args: EnvServeArgs) -> Result<()> {
    let mut cfg = args.config()?;
    let python = args.python()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("building the tokio runtime")?;
    runtime.block_on(async move {
        if let Some(p) = python {
            // Before the port opens: a missing interpreter is said at once, not at the
            // first client's request.
            // The pool's error names the interpreter.
            let pool = PythonPool::start(p)
                .await
                .context("--reward-python: starting the workers")?;
            cfg.python = Some(pool);
        }
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("binding {}:{}", args.host, args.port))?;
        let addr = listener.local_addr().context("reading the bound address")?;
        // Handlers first: a client may signal as soon as it reads the address.
        let shutdown = crate::signal::shutdown_signal();
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "listening on http://{addr}")?;
        stdout.flush()?;
        drop(stdout);
        tracing::info!(%addr, auth = cfg.api_key.is_some(), "env-serve started");
        let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
        let server = serve(listener, cfg, async move {
            shutdown.await;
            let _ = stopping_tx.send(());
        });
        // Graceful shutdown waits for requests in flight, and a hung environment never
        // finishes its: give them a grace period, then exit anyway.
        let grace = async {
            if stopping_rx.await.is_ok() {
                tokio::time::sleep(SHUTDOWN_GRACE).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            r = server => r.context("serving")?,
            _ = grace => tracing::warn!(
                "requests still running {}s after the shutdown signal; exiting",
                SHUTDOWN_GRACE.as_secs()
            ),
        }
        tracing::info!("env-serve stopped");
        Ok(())
    })
}
