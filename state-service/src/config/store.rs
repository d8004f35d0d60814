//! Store selection and the Redis store's settings (`store = "redis"` plus `[redis]`).

use serde::{Deserialize, Serialize};

#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreKind {
    /// Embedded, single instance (the default).
    #[default]
    Memory,
    /// Shared through one or more Redis nodes (client-side sharding).
    Redis,
}

#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisConfig {
    /// One URL per shard, e.g. `redis://10.0.0.7:6379`. Keys are spread by rendezvous
    /// hashing over these strings: every replica must list the same URLs.
    pub urls: Vec<String>,
    /// Prefix of every key and channel, so several fleets can share Redis.
    pub key_prefix: String,
    /// This replica's name (lease owner, origin of replicated events). Default: random.
    pub replica_id: Option<String>,
    /// Bound of every Redis call.
    pub timeout_ms: u64,
    /// Ingestion lease TTL; the holder renews it every third of it.
    pub lease_ttl_ms: u64,
    /// How often lease holders flush their engines' mirror changes.
    pub mirror_interval_ms: u64,
    /// Shard health probe interval (a down shard is retried this often).
    pub probe_interval_ms: u64,
    /// Replicated writes waiting to be sent; beyond this they are dropped and counted.
    pub queue: usize,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            urls: vec!["redis://127.0.0.1:6379".into()],
            key_prefix: "kvroute".into(),
            replica_id: None,
            timeout_ms: 200,
            lease_ttl_ms: 3_000,
            mirror_interval_ms: 50,
            probe_interval_ms: 200,
            queue: 10_000,
        }
    }
}
