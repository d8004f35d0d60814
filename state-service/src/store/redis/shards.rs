//! The Redis nodes and which of them owns a key.
//!
//! Client-side sharding by rendezvous (highest random weight) hashing of the key against
//! each node's URL: stable across replicas and restarts as long as every replica lists the
//! same URLs, and removing a node moves only that node's keys. Each node has one lazily
//! connected [`ConnectionManager`] (multiplexed: concurrent calls pipeline on one socket,
//! and it reconnects by itself), so a node that is down at start-up does not stop the
//! service.
//!
//! Every call is bounded by the configured timeout. A failed or timed-out call marks the
//! node down; only a successful probe (PING) marks it up again, and the transition is
//! reported to whoever rewrites state that was lost while it was down.

use super::StoreError;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, FromRedisValue, Pipeline};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Index of a node in the configured list.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShardId(pub usize);

pub struct Shard {
    pub url: String,
    client: redis::Client,
    conn: ConnectionManager,
    up: AtomicBool,
    /// Times this node went from up to down.
    pub outages: AtomicU64,
    /// Calls that failed or timed out.
    pub errors: AtomicU64,
}

pub struct Shards {
    nodes: Vec<Shard>,
    seeds: Vec<u64>,
    timeout: Duration,
}

impl Shards {
    /// Parses the URLs and prepares lazy connections; nothing is contacted yet.
    pub fn new(urls: &[String], timeout: Duration) -> Result<Shards, StoreError> {
        if urls.is_empty() {
            return Err(StoreError::Config("redis.urls is empty".into()));
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(1)
            .set_max_delay(timeout);
        let mut nodes = Vec::with_capacity(urls.len());
        for url in urls {
            let client = redis::Client::open(url.as_str()).map_err(|e| StoreError::Config(format!("redis url {url}: {e}")))?;
            let conn = client.get_connection_manager_lazy(config.clone())?;
            // Optimistic: the first call or probe corrects it.
            let up = AtomicBool::new(true);
            nodes.push(Shard { url: url.clone(), client, conn, up, outages: AtomicU64::new(0), errors: AtomicU64::new(0) });
        }
        let seeds = urls.iter().map(|u| xxh3_64_with_seed(u.as_bytes(), 0x6b76_726f_7574_65)).collect();
        Ok(Shards { nodes, seeds, timeout })
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn ids(&self) -> impl Iterator<Item = ShardId> {
        (0..self.nodes.len()).map(ShardId)
    }

    pub fn node(&self, id: ShardId) -> &Shard {
        &self.nodes[id.0 % self.nodes.len()]
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The node owning `key` (rendezvous hashing).
    pub fn owner(&self, key: &str) -> ShardId {
        let h = |seed: u64| xxh3_64_with_seed(key.as_bytes(), seed);
        let best = self.seeds.iter().enumerate().max_by_key(|(_, s)| h(**s)).map_or(0, |(i, _)| i);
        ShardId(best)
    }

    pub fn is_up(&self, id: ShardId) -> bool {
        self.node(id).up.load(Ordering::Relaxed)
    }

    pub fn all_up(&self) -> bool {
        self.nodes.iter().all(|n| n.up.load(Ordering::Relaxed))
    }

    /// A client for connections that cannot be shared (pub/sub).
    pub fn client(&self, id: ShardId) -> &redis::Client {
        &self.node(id).client
    }

    pub async fn cmd<T: FromRedisValue>(&self, id: ShardId, cmd: &Cmd) -> Result<T, StoreError> {
        let mut conn = self.node(id).conn.clone();
        let r = tokio::time::timeout(self.timeout, cmd.query_async(&mut conn)).await;
        self.settle(id, r)
    }

    pub async fn pipe<T: FromRedisValue>(&self, id: ShardId, pipe: &Pipeline) -> Result<T, StoreError> {
        let mut conn = self.node(id).conn.clone();
        let r = tokio::time::timeout(self.timeout, pipe.query_async(&mut conn)).await;
        self.settle(id, r)
    }

    /// PINGs the node; returns true when it just came back (was down, is up).
    pub async fn probe(&self, id: ShardId) -> bool {
        let mut conn = self.node(id).conn.clone();
        let ok = matches!(
            tokio::time::timeout(self.timeout, redis::cmd("PING").query_async::<String>(&mut conn)).await,
            Ok(Ok(_))
        );
        match ok {
            true => !self.node(id).up.swap(true, Ordering::Relaxed),
            false => {
                self.mark_down(id);
                false
            }
        }
    }

    pub fn mark_down(&self, id: ShardId) {
        let node = self.node(id);
        if node.up.swap(false, Ordering::Relaxed) {
            node.outages.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(shard = %node.url, "redis shard down: picks continue on local state");
        }
    }

    fn settle<T>(&self, id: ShardId, r: Result<redis::RedisResult<T>, tokio::time::error::Elapsed>) -> Result<T, StoreError> {
        let out = match r {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) if !is_connection_error(&e) => return Err(StoreError::Redis(e)),
            Ok(Err(e)) => Err(StoreError::Redis(e)),
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        };
        self.node(id).errors.fetch_add(1, Ordering::Relaxed);
        self.mark_down(id);
        out
    }
}

/// Errors that say the node is unreachable, as opposed to a bad command or reply.
fn is_connection_error(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout() || e.is_unrecoverable_error()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn rendezvous_is_stable_and_spreads() {
        let urls: Vec<String> = (0..3).map(|i| format!("redis://127.0.0.1:{}", 7000 + i)).collect();
        let s = Shards::new(&urls, Duration::from_millis(50)).expect("valid urls");
        let mut counts = [0usize; 3];
        for k in 0..3000 {
            let key = format!("kvroute:asg:{k}");
            let owner = s.owner(&key);
            assert_eq!(owner, s.owner(&key));
            counts[owner.0] += 1;
        }
        assert!(counts.iter().all(|c| *c > 800), "{counts:?}");
        // Dropping the last node moves only its keys.
        let s2 = Shards::new(&urls[..2], Duration::from_millis(50)).expect("valid urls");
        for k in 0..300 {
            let key = format!("kvroute:asg:{k}");
            if s.owner(&key).0 < 2 {
                assert_eq!(s.owner(&key), s2.owner(&key));
            }
        }
    }
}
