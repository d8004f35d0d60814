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
//! reported to whoever rewrites state that was lost while it was down. A probe that times out
//! replaces the node's connection: the manager reconnects only on errors, and a black-holed
//! socket never gives one, so without this a half-open connection would stay down forever.
//!
//! URLs may be `rediss://` (TLS through rustls; the server's chain is verified against the
//! system roots or the `ca_file` PEM, and `#insecure` is refused) and carry a user and
//! password (`rediss://user:pass@host:port`); a password from `password_file` /
//! `password_env` goes into every URL that has none. Passwords never appear in logs or
//! metrics (the node's `url` is redacted), and placement hashes the URL as configured.

use super::StoreError;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use parking_lot::Mutex;
use redis::{Cmd, ConnectionAddr, FromRedisValue, IntoConnectionInfo, Pipeline, ScriptInvocation};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Index of a node in the configured list.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShardId(pub usize);

pub struct Shard {
    /// The configured URL with its password replaced by `***` (for logs and metrics).
    pub url: String,
    client: redis::Client,
    conn: Mutex<ConnectionManager>,
    up: AtomicBool,
    /// Whether this replica's subscription to the node's event channel is live (optimistic
    /// until the first one fails or times out).
    subscribed: AtomicBool,
    /// Times this node went from up to down.
    pub outages: AtomicU64,
    /// Calls that failed or timed out.
    pub errors: AtomicU64,
}

pub struct Shards {
    nodes: Vec<Shard>,
    seeds: Vec<u64>,
    timeout: Duration,
    manager: ConnectionManagerConfig,
}

/// How to reach the nodes beyond their URLs.
#[derive(Clone, Debug, Default)]
pub struct ConnectOptions {
    /// Used for every URL without a password of its own.
    pub password: Option<String>,
    /// PEM of the CA(s) to trust for `rediss://` URLs instead of the system roots.
    pub ca_pem: Option<Vec<u8>>,
}

/// `url` with the password of its user info replaced by `***`.
pub fn redact(url: &str) -> String {
    let Some(start) = url.find("://").map(|i| i + 3) else { return url.to_string() };
    let end = url[start..].find(['/', '?', '#']).map_or(url.len(), |i| start + i);
    let Some(at) = url[start..end].rfind('@').map(|i| start + i) else { return url.to_string() };
    match url[start..at].find(':') {
        Some(colon) => format!("{}:***{}", &url[..start + colon], &url[at..]),
        None => url.to_string(),
    }
}

/// A client for `url`: TLS when it says `rediss://`, `opts.password` when it has none.
fn client(url: &str, opts: &ConnectOptions) -> Result<redis::Client, StoreError> {
    let shown = redact(url);
    let bad = |e: redis::RedisError| StoreError::Config(format!("redis url {shown}: {e}"));
    let mut info = url.into_connection_info().map_err(bad)?;
    if let (Some(pw), None) = (&opts.password, info.redis_settings().password()) {
        let settings = info.redis_settings().clone().set_password(pw);
        info = info.set_redis_settings(settings);
    }
    match info.addr() {
        ConnectionAddr::TcpTls { insecure: true, .. } => Err(StoreError::Config(format!(
            "redis url {shown}: #insecure would accept any certificate; trust the server's CA with redis.ca_file instead"
        ))),
        ConnectionAddr::TcpTls { .. } => {
            // rustls needs a process-wide provider; an application that installed one keeps it.
            let _ = rustls::crypto::ring::default_provider().install_default();
            match &opts.ca_pem {
                Some(pem) => redis::Client::build_with_tls(info, redis::TlsCertificates { client_tls: None, root_cert: Some(pem.clone()) }).map_err(bad),
                None => redis::Client::open(info).map_err(bad),
            }
        }
        _ => redis::Client::open(info).map_err(bad),
    }
}

impl Shards {
    /// Parses the URLs and prepares lazy connections; nothing is contacted yet.
    pub fn new(urls: &[String], timeout: Duration) -> Result<Shards, StoreError> {
        Shards::with_options(urls, timeout, &ConnectOptions::default())
    }

    /// [`Shards::new`] with a password and trusted CA for the URLs (module docs).
    pub fn with_options(urls: &[String], timeout: Duration, opts: &ConnectOptions) -> Result<Shards, StoreError> {
        if urls.is_empty() {
            return Err(StoreError::Config("redis.urls is empty".into()));
        }
        let manager = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(1)
            .set_max_delay(timeout);
        let mut nodes = Vec::with_capacity(urls.len());
        for url in urls {
            let client = client(url, opts)?;
            let conn = Mutex::new(client.get_connection_manager_lazy(manager.clone())?);
            // Optimistic: the first call or probe corrects it.
            let (up, subscribed) = (AtomicBool::new(true), AtomicBool::new(true));
            nodes.push(Shard { url: redact(url), client, conn, up, subscribed, outages: AtomicU64::new(0), errors: AtomicU64::new(0) });
        }
        // Placement hashes the URLs as configured (a password added from a file is not part
        // of it, so rotating that password moves no key).
        let seeds = urls.iter().map(|u| xxh3_64_with_seed(u.as_bytes(), 0x006b_7672_6f75_7465)).collect();
        Ok(Shards { nodes, seeds, timeout, manager })
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

    pub fn is_subscribed(&self, id: ShardId) -> bool {
        self.node(id).subscribed.load(Ordering::Relaxed)
    }

    pub fn all_subscribed(&self) -> bool {
        self.nodes.iter().all(|n| n.subscribed.load(Ordering::Relaxed))
    }

    /// The subscriber's view of its subscription to the node.
    pub fn set_subscribed(&self, id: ShardId, live: bool) {
        self.node(id).subscribed.store(live, Ordering::Relaxed);
    }

    /// A client for connections that cannot be shared (pub/sub).
    pub fn client(&self, id: ShardId) -> &redis::Client {
        &self.node(id).client
    }

    pub async fn cmd<T: FromRedisValue>(&self, id: ShardId, cmd: &Cmd) -> Result<T, StoreError> {
        let mut conn = self.node(id).conn.lock().clone();
        let r = tokio::time::timeout(self.timeout, cmd.query_async(&mut conn)).await;
        self.settle(id, r)
    }

    pub async fn pipe<T: FromRedisValue>(&self, id: ShardId, pipe: &Pipeline) -> Result<T, StoreError> {
        let mut conn = self.node(id).conn.lock().clone();
        let r = tokio::time::timeout(self.timeout, pipe.query_async(&mut conn)).await;
        self.settle(id, r)
    }

    /// Runs a Lua script by EVALSHA, loading it on NOSCRIPT (a node restarted or flushed
    /// since the last call) and retrying once; one timeout bounds the whole exchange.
    pub async fn script<T: FromRedisValue>(&self, id: ShardId, script: &ScriptInvocation<'_>) -> Result<T, StoreError> {
        let mut conn = self.node(id).conn.lock().clone();
        let r = tokio::time::timeout(self.timeout, script.invoke_async(&mut conn)).await;
        self.settle(id, r)
    }

    /// PINGs the node; returns true when it just came back (was down, is up). A PING that
    /// times out replaces the node's connection (module docs).
    pub async fn probe(&self, id: ShardId) -> bool {
        let node = self.node(id);
        let mut conn = node.conn.lock().clone();
        match tokio::time::timeout(self.timeout, redis::cmd("PING").query_async::<String>(&mut conn)).await {
            Ok(Ok(_)) => !node.up.swap(true, Ordering::Relaxed),
            Ok(Err(e)) => {
                self.mark_down_because(id, &e);
                false
            }
            Err(_) => {
                self.mark_down_because(id, &StoreError::Timeout(self.timeout));
                match node.client.get_connection_manager_lazy(self.manager.clone()) {
                    Ok(fresh) => *node.conn.lock() = fresh,
                    Err(e) => tracing::debug!(shard = %node.url, error = %e, "connection not replaced"),
                }
                false
            }
        }
    }

    pub fn mark_down(&self, id: ShardId) {
        self.mark_down_because(id, &"unreachable");
    }

    /// Marks the node down, logging `why` when it was up.
    pub fn mark_down_because(&self, id: ShardId, why: &dyn std::fmt::Display) {
        let node = self.node(id);
        if node.up.swap(false, Ordering::Relaxed) {
            node.outages.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(shard = %node.url, error = %why, "redis shard down: picks continue on local state");
        }
    }

    fn settle<T>(&self, id: ShardId, r: Result<redis::RedisResult<T>, tokio::time::error::Elapsed>) -> Result<T, StoreError> {
        let out = match r {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) if !is_connection_error(&e) => return Err(StoreError::Redis(e)),
            Ok(Err(e)) => StoreError::Redis(e),
            Err(_) => StoreError::Timeout(self.timeout),
        };
        self.node(id).errors.fetch_add(1, Ordering::Relaxed);
        self.mark_down_because(id, &out);
        Err(out)
    }
}

/// Errors that say the node is unreachable, as opposed to a bad command or reply.
fn is_connection_error(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout() || e.is_unrecoverable_error()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(redact("rediss://kv:s3cret@10.0.0.7:6380/0"), "rediss://kv:***@10.0.0.7:6380/0");
        assert_eq!(redact("redis://:s3cret@host"), "redis://:***@host");
        assert_eq!(redact("redis://user@host:1"), "redis://user@host:1");
        assert_eq!(redact("redis://u:p@ss@host"), "redis://u:***@host");
    }

    #[tokio::test]
    async fn insecure_tls_is_refused() {
        let urls = vec!["rediss://127.0.0.1:6380/#insecure".to_string()];
        let err = Shards::new(&urls, Duration::from_millis(50)).err().expect("refused");
        assert!(err.to_string().contains("ca_file"), "{err}");
        let tls = vec!["rediss://u:p@127.0.0.1:6380".to_string()];
        assert_eq!(Shards::new(&tls, Duration::from_millis(50)).expect("TLS url").node(ShardId(0)).url, "rediss://u:***@127.0.0.1:6380");
    }

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
        // Placement hashes the URL as written, password and all; a password given apart
        // from the URL (password_file) changes nothing.
        let opts = ConnectOptions { password: Some("pw".into()), ca_pem: None };
        let s3 = Shards::with_options(&urls, Duration::from_millis(50), &opts).expect("valid urls");
        assert!((0..300).all(|k| s3.owner(&format!("kvroute:asg:{k}")) == s.owner(&format!("kvroute:asg:{k}"))));
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
