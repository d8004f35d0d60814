//! `redis-server` shards for the Redis store: each on a free loopback port, without
//! persistence (`--save "" --appendonly no`), killed when its guard drops. A shard can be
//! killed (SIGKILL) and restarted, empty, on the same port.

use crate::net::{free_port, wait_for};
use crate::paths;
use crate::proc::Proc;
use anyhow::Result;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub struct RedisServer {
    pub port: u16,
    proc: Option<Proc>,
}

impl RedisServer {
    /// Starts a server and waits until it answers PING.
    pub async fn start() -> Result<RedisServer> {
        let mut s = RedisServer { port: free_port(), proc: None };
        s.restart().await?;
        Ok(s)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts the server (again) on its port, empty, and waits until it answers PING.
    pub async fn restart(&mut self) -> Result<()> {
        self.kill();
        let args: Vec<String> = ["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut proc = Proc::spawn("redis", &paths::redis_server()?, &args)?;
        let port = self.port;
        if let Err(e) = wait_for(&format!("redis-server on {port} to answer PING"), Duration::from_secs(20), || ping(port)).await {
            proc.check_alive()?;
            return Err(e);
        }
        self.proc = Some(proc);
        Ok(())
    }

    /// SIGKILLs the server (a crash: connections are reset, nothing is flushed).
    pub fn kill(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill();
        }
    }
}

/// `Some(())` when a `PING` on `port` answers `+PONG`.
async fn ping(port: u16) -> Option<()> {
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        s.write_all(b"PING\r\n").await.ok()?;
        let mut buf = [0u8; 16];
        let n = s.read(&mut buf).await.ok()?;
        buf[..n].starts_with(b"+PONG").then_some(())
    };
    tokio::time::timeout(Duration::from_millis(500), attempt).await.ok().flatten()
}
