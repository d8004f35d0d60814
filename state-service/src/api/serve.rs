//! Serving the router: what `axum::serve` does, plus a deadline on request headers. A
//! connection that has not sent a complete request head within `header_read_timeout` (a slow
//! or silent client) is closed, so thousands of such connections hold no task for long.

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::time::Duration;
use tokio::net::TcpListener;

/// How long a stopping service waits for requests in flight.
const DRAIN: Duration = Duration::from_secs(10);

/// Serves `router` on `listener` until `shutdown` resolves, then lets requests in flight finish
/// (up to 10 s).
pub async fn serve(listener: TcpListener, router: Router, header_read_timeout: Duration, shutdown: impl Future<Output = ()>) {
    let mut builder = Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(header_read_timeout);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: pause instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let (builder, router, watcher) = (builder.clone(), router.clone(), graceful.watcher());
        tokio::spawn(async move {
            // hyper's deadline runs from a request's first byte: a client that sends none is
            // closed here.
            let mut first = [0u8; 1];
            if !matches!(tokio::time::timeout(header_read_timeout, stream.peek(&mut first)).await, Ok(Ok(1))) {
                return;
            }
            let service = TowerToHyperService::new(router);
            let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
            // A client that went away or timed out is not the service's error.
            let _ = watcher.watch(connection).await;
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN, graceful.shutdown()).await.is_err() {
        tracing::warn!("requests still in flight after {DRAIN:?}: stopping anyway");
    }
}
