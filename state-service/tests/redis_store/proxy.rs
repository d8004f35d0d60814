//! A TCP proxy in front of a `redis-server`, to make a shard slow or half-open: every chunk
//! it forwards (either way) waits `delay` first, and `pause(true)` stops forwarding without
//! closing any socket (what a black-holed link looks like to both ends; bytes already sent
//! wait in the buffers and flow again on `pause(false)`, as after a healed partition).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use tokio::sync::watch;

pub struct Proxy {
    pub port: u16,
    delay_ms: Arc<AtomicU64>,
    paused: watch::Sender<bool>,
    rt: Option<Runtime>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards every connection to `target`.
    pub fn start(target: u16) -> Proxy {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
        let listener = rt.block_on(TcpListener::bind("127.0.0.1:0")).expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let delay_ms = Arc::new(AtomicU64::new(0));
        let (paused, watch) = watch::channel(false);
        let delay = delay_ms.clone();
        rt.spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (delay, watch) = (delay.clone(), watch.clone());
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await else { return };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    let up = tokio::spawn(pipe(cr, sw, delay.clone(), watch.clone()));
                    pipe(sr, cw, delay, watch).await;
                    up.abort();
                });
            }
        });
        Proxy { port, delay_ms, paused, rt: Some(rt) }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Every chunk forwarded from now on waits this long first.
    pub fn set_delay(&self, delay: Duration) {
        self.delay_ms.store(delay.as_millis() as u64, Ordering::Relaxed);
    }

    /// Stops (true) or resumes (false) forwarding on every connection, new ones included.
    pub fn pause(&self, on: bool) {
        let _ = self.paused.send(on);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

async fn unpaused(watch: &mut watch::Receiver<bool>) {
    let _ = watch.wait_for(|paused| !paused).await;
}

async fn pipe(mut from: tokio::net::tcp::OwnedReadHalf, mut to: tokio::net::tcp::OwnedWriteHalf, delay: Arc<AtomicU64>, mut watch: watch::Receiver<bool>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        unpaused(&mut watch).await;
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let d = delay.load(Ordering::Relaxed);
        if d > 0 {
            tokio::time::sleep(Duration::from_millis(d)).await;
        }
        unpaused(&mut watch).await;
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
