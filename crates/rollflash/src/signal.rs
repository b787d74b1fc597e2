//! The shutdown signal the servers (`serve`, `env-serve`) wait for.

/// Completes on Ctrl-C or (on Unix) SIGTERM, the signals service managers send. The SIGTERM
/// handler is installed when this is called, not when it is first polled, so a signal that
/// arrives right after the "listening" line is not lost to the default action (exit).
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
    async move {
        let ctrl_c = async {
            if let Err(e) = tokio::signal::ctrl_c().await {
                tracing::warn!("cannot listen for Ctrl-C: {e}");
                std::future::pending::<()>().await;
            }
        };
        #[cfg(unix)]
        let term = async move {
            match term {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(e) => {
                    tracing::warn!("cannot listen for SIGTERM: {e}");
                    std::future::pending::<()>().await;
                }
            }
        };
        #[cfg(not(unix))]
        let term = std::future::pending::<()>();
        tokio::select! {
            _ = ctrl_c => {}
            _ = term => {}
        }
    }
}
