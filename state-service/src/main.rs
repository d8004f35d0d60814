//! `kvroute-state --config path.toml [--listen 127.0.0.1:9000] [--policy kvroute]`
//!
//! Thin on purpose: parse the config, start the service (`App::start`), serve the API until
//! SIGTERM or ctrl-c.

use anyhow::Context;
use clap::Parser;
use kvroute_kv::index::memory::MemoryIndex;
use kvroute_state::app::App;
use kvroute_state::config::{Cli, Config};
use kvroute_state::store::{memory::MemoryStore, redis::RedisStore, StoreKind};
use std::sync::Arc;
use tracing_subscriber::EnvFilter;

/// Tokenizing a cold prompt is allocation-bound (a `String` and offsets per token inside
/// `tokenizers`): mimalloc halves it against glibc's malloc (8k words 17.4 -> 8.2 ms,
/// `cargo run -p kvroute-tokenize --release --example plain_text_bench`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .init();
    let config = Config::from_cli(&cli).context("configuration")?;
    let listen = config.listen;
    let (workers, policy) = (config.workers.len(), config.policy);
    let store = match config.store {
        StoreKind::Memory => MemoryStore::store(Arc::new(MemoryIndex::new())),
        StoreKind::Redis => RedisStore::connect(&config).await.context("redis store")?.store(),
    };
    let app = App::start(config, store).context("registering workers")?;
    let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
    tracing::info!(%listen, workers, %policy, "kvroute-state serving");
    let header_read = std::time::Duration::from_millis(app.config.timeouts.header_read_ms);
    kvroute_state::api::serve(listener, app.router(), header_read, shutdown()).await;
    tracing::info!("kvroute-state stopped");
    Ok(())
}

/// Resolves on ctrl-c or SIGTERM.
async fn shutdown() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for ctrl-c");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutting down");
}
