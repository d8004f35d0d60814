//! Store selection and the Redis store's settings (`store = "redis"` plus `[redis]`).

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

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
    /// Replicated writes waiting to be sent, per shard; beyond this they are dropped and
    /// counted. Every shard has its own queue and writer, so a slow shard never delays the
    /// others' writes.
    pub queue: usize,
    /// Every replica publishes a heartbeat on every shard's channel this often; a
    /// subscription that hears nothing (not even its own heartbeat) for three of these is
    /// taken as dead: the shard counts as down and it resubscribes. Must be > 0.
    pub heartbeat_ms: u64,
    /// PEM file of the CA(s) trusted for `rediss://` URLs (instead of the system roots).
    pub ca_file: Option<PathBuf>,
    /// File holding the Redis password (read at start, whitespace trimmed), applied to every
    /// URL that has none (with the URL's user name, if any, for an ACL user).
    pub password_file: Option<PathBuf>,
    /// Name of an environment variable holding the password, as `password_file` (one of the
    /// two at most).
    pub password_env: Option<String>,
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
            heartbeat_ms: 500,
            ca_file: None,
            password_file: None,
            password_env: None,
        }
    }
}

impl RedisConfig {
    /// Checks what the store needs before it connects; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.urls.is_empty() {
            return Err("redis.urls: at least one URL".into());
        }
        if self.heartbeat_ms == 0 {
            return Err("redis.heartbeat_ms: must be > 0".into());
        }
        if self.password_file.is_some() && self.password_env.is_some() {
            return Err("redis.password_file, redis.password_env: set one at most".into());
        }
        Ok(())
    }

    /// The password from `password_file` or `password_env`, trimmed; `None` when neither is
    /// set.
    pub fn password(&self) -> Result<Option<String>, String> {
        let raw = match (&self.password_file, &self.password_env) {
            (Some(path), _) => std::fs::read_to_string(path).map_err(|e| format!("redis.password_file {}: {e}", path.display()))?,
            (None, Some(var)) => std::env::var(var).map_err(|e| format!("redis.password_env {var}: {e}"))?,
            (None, None) => return Ok(None),
        };
        let pw = raw.trim();
        if pw.is_empty() {
            return Err("redis password (password_file / password_env) is empty".into());
        }
        Ok(Some(pw.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_and_password_sources() {
        assert_eq!(RedisConfig::default().validate(), Ok(()));
        let zero = RedisConfig { heartbeat_ms: 0, ..RedisConfig::default() };
        assert!(zero.validate().is_err_and(|e| e.contains("heartbeat_ms")));
        let dir = std::env::temp_dir().join(format!("kvroute-pw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let file = dir.join("pw");
        std::fs::write(&file, "  s3cret\n").expect("write");
        let c = RedisConfig { password_file: Some(file.clone()), ..RedisConfig::default() };
        assert_eq!(c.password(), Ok(Some("s3cret".into())));
        let both = RedisConfig { password_env: Some("X".into()), ..c.clone() };
        assert!(both.validate().is_err());
        std::fs::write(&file, "\n").expect("write");
        assert!(c.password().is_err(), "an empty password file is an error, not no password");
        let missing = RedisConfig { password_file: Some(dir.join("nope")), ..RedisConfig::default() };
        assert!(missing.password().is_err_and(|e| e.contains("password_file")));
        assert_eq!(RedisConfig::default().password(), Ok(None));
        let unset = RedisConfig { password_env: Some("KVROUTE_TEST_SURELY_UNSET_VAR".into()), ..RedisConfig::default() };
        assert!(unset.password().is_err_and(|e| e.contains("KVROUTE_TEST_SURELY_UNSET_VAR")), "an unset variable is an error");
        if let Ok(path) = std::env::var("PATH") {
            let env = RedisConfig { password_env: Some("PATH".into()), ..RedisConfig::default() };
            assert_eq!(env.password(), Ok(Some(path.trim().to_string())));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
