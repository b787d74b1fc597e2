//! `rollflash dashboard RUN_DIR`: the run dashboard of a finished (or still running) run,
//! served from its files (`metrics.jsonl`, `summary.json`, `timeline.jsonl`,
//! `trajectories.jsonl`) until Ctrl-C. Also how `rollflash train --dashboard` starts it.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use rollflash_dashboard::{Dashboard, DashboardConfig, Live};

#[derive(Debug, Args)]
pub struct DashboardArgs {
    /// The run's output directory.
    dir: PathBuf,
    /// Address to serve on; loopback by default. Beyond loopback it needs an API key
    /// (ROLLFLASH_API_KEY), and the page is opened as `http://HOST:PORT/?key=KEY`.
    #[arg(long, default_value = "127.0.0.1:8686")]
    addr: SocketAddr,
}

pub fn run(a: DashboardArgs) -> Result<()> {
    if !a.dir.is_dir() {
        anyhow::bail!("{} is not a run directory", a.dir.display());
    }
    let api_key = std::env::var("ROLLFLASH_API_KEY")
        .ok()
        .filter(|k| !k.is_empty());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        let d = start(a.addr, api_key, a.dir, None).await?;
        crate::signal::shutdown_signal().await;
        d.shutdown().await;
        Ok(())
    })
}

/// Starts the dashboard over `dir` and prints its address (`dashboard: http://…/`, the
/// line tests read).
pub async fn start(
    addr: SocketAddr,
    api_key: Option<String>,
    dir: PathBuf,
    live: Option<Live>,
) -> Result<Dashboard> {
    let d = Dashboard::start(
        DashboardConfig {
            addr,
            api_key,
            run_dir: dir,
        },
        live,
    )
    .await?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "dashboard: http://{}/", d.addr())?;
    out.flush()?;
    Ok(d)
}
