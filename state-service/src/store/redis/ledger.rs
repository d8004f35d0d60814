//! The budget ledger in Redis: every replica charges the same sliding log per scope, so a
//! tenant's budget holds across the fleet (see [`crate::tenancy::ledger`] for the contract;
//! [`crate::tenancy::window::Window`] is the reference this mirrors step by step).
//!
//! Each scope lives on the shard owning its [`Scope::key`], under
//! `{prefix}:budget:{<scope key>}:` + `log` (ZSET id -> admitted at, ms), `amt` (HASH id ->
//! tokens charged), `sum` (the window's tokens), `lease` (ZSET id -> lease end, ms), `late`
//! and `lamt` (charges settled after their reservation left the window: ZSET id -> settled
//! at, HASH id -> tokens beyond the reservation; tokens, not requests) and `limits` (the
//! runtime override: a HASH with a `set` marker, so an all-unlimited override exists too,
//! and one field per limit; no field, no limit). Every shard also keeps the SET
//! `{prefix}:budget:overrides` of the scopes it holds an override for.
//!
//! Reserve, settle and usage are each one Lua script, so a call is atomic on its shard:
//! entries older than the window leave it (with their charge), expired leases end, and only
//! then is the call's check or change made. Every reserve that records something sets the
//! ledger keys to expire after window + lease, so an idle scope leaves nothing behind; an
//! override stays until it is removed. Amounts go to Redis as decimal strings and are added
//! by `INCRBY`/`DECRBY` (Lua numbers are doubles and are formatted with 14 digits when passed
//! to a command); only comparisons happen in Lua.
//!
//! The clock is the caller's wall clock (unix ms): replicas agree to NTP precision, far
//! inside a window. A call fails with [`LedgerError`] when its shard is down (at once: the
//! store's probe brings it back), refuses, or does not answer within the shard timeout; a
//! reservation that timed out may still have been recorded, and then holds its charge for a
//! window and its slot for a lease, like one whose settle was lost.

use super::shards::{ShardId, Shards};
use super::StoreError;
use crate::tenancy::ledger::{Ledger, LedgerError, LedgerFuture, Limit, Limits, Outcome, Reserve, Scope, Settle, Usage};
use crate::tenancy::window::CONCURRENCY_RETRY_MS;
use redis::{Script, ScriptInvocation};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{SystemTime, UNIX_EPOCH};

/// Shared by every script. KEYS: log, amt, sum, lease, limits, late, lamt; ARGV[1] now,
/// ARGV[2] the newest admission time that has left the window (now - window).
const EXPIRE: &str = r"
local log, amt, sum, lease, late, lamt = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6], KEYS[7]
local function age_out(z, h)
  while true do
    local old = redis.call('ZRANGEBYSCORE', z, '-inf', ARGV[2], 'LIMIT', 0, 512)
    if #old == 0 then break end
    local charged = redis.call('HMGET', h, unpack(old))
    for i = 1, #old do
      if charged[i] then redis.call('DECRBY', sum, charged[i]) end
    end
    redis.call('ZREM', z, unpack(old))
    redis.call('HDEL', h, unpack(old))
  end
end
age_out(log, amt)
age_out(late, lamt)
redis.call('ZREMRANGEBYSCORE', lease, '-inf', ARGV[1])
if redis.call('ZCARD', log) == 0 then redis.call('DEL', amt) end
if redis.call('ZCARD', log) == 0 and redis.call('ZCARD', late) == 0 then redis.call('DEL', sum) end
local function usage()
  return tonumber(redis.call('GET', sum) or '0'), redis.call('ZCARD', log), redis.call('ZCARD', lease)
end
";

/// ARGV[3] window, [4] lease end, [5] id, [6] tokens, [7..9] tokens / requests / concurrent
/// limits ('' = none), [10] key TTL, [11] the concurrency retry. Returns {code, retry after,
/// tokens, requests, concurrent}: code 0 admitted, else a [`Limit::code`].
const RESERVE: &str = r"
local now, window, id, tokens = tonumber(ARGV[1]), tonumber(ARGV[3]), ARGV[5], tonumber(ARGV[6])
local function num(v) if v then return tonumber(v) end end
local tpm, rpm, conc = num(ARGV[7]), num(ARGV[8]), num(ARGV[9])
if redis.call('EXISTS', KEYS[5]) == 1 then
  local o = redis.call('HMGET', KEYS[5], 'tokens_per_minute', 'requests_per_minute', 'concurrent_requests')
  tpm, rpm, conc = num(o[1]), num(o[2]), num(o[3])
end
local tok, req, run = usage()
-- The same id reserved twice (a replayed pick): admitted once, charged once,
-- even when the scope is full now (its own entry fills it).
if redis.call('HEXISTS', amt, id) == 1 or redis.call('ZSCORE', lease, id) then return {0, 0, tok, req, run} end
local function aged_out(at) return math.max(at + window - now, 1) end
-- When (admission time of the entry whose expiry frees enough) the tokens drop to `room`.
local function fits_after(room)
  local left, start = tok, 0
  while true do
    local page = redis.call('ZRANGE', log, start, start + 255, 'WITHSCORES')
    if #page == 0 then return nil end
    local ids = {}
    for i = 1, #page, 2 do ids[#ids + 1] = page[i] end
    local charged = redis.call('HMGET', amt, unpack(ids))
    for i = 1, #ids do
      left = left - (tonumber(charged[i]) or 0)
      if left <= room then return tonumber(page[2 * i]) end
    end
    start = start + 256
  end
end
if rpm and req + 1 > rpm then
  local oldest = redis.call('ZRANGE', log, 0, 0, 'WITHSCORES')
  local retry = window
  if #oldest > 0 then retry = aged_out(tonumber(oldest[2])) end
  return {2, retry, tok, req, run}
end
if tpm and tok + tokens > tpm then
  local retry = window
  if tokens <= tpm then
    local at = fits_after(tpm - tokens)
    if at then retry = aged_out(at) end
  end
  return {1, retry, tok, req, run}
end
if conc and run + 1 > conc then return {3, tonumber(ARGV[11]), tok, req, run} end
redis.call('ZADD', log, ARGV[1], id)
redis.call('HSET', amt, id, ARGV[6])
tok = redis.call('INCRBY', sum, ARGV[6])
redis.call('ZADD', lease, ARGV[4], id)
for _, i in ipairs({1, 2, 3, 4, 6, 7}) do redis.call('PEXPIRE', KEYS[i], ARGV[10]) end
return {0, 0, tok, req + 1, run + 1}
";

/// ARGV[3] id, [4] the tokens it really cost, [5] what they exceed its reservation by, [6]
/// the least key TTL. A reservation still in the window is replaced; one that left it has its
/// excess charged now (the late keys live as long as the sum that counts them).
const SETTLE: &str = r"
local old = redis.call('HGET', amt, ARGV[3])
if old then
  redis.call('DECRBY', sum, old)
  redis.call('INCRBY', sum, ARGV[4])
  redis.call('HSET', amt, ARGV[3], ARGV[4])
elseif ARGV[5] ~= '0' then
  redis.call('ZADD', late, ARGV[1], ARGV[3])
  redis.call('HINCRBY', lamt, ARGV[3], ARGV[5])
  redis.call('INCRBY', sum, ARGV[5])
  local ttl = math.max(redis.call('PTTL', sum), tonumber(ARGV[6]))
  for _, k in ipairs({late, lamt, sum}) do redis.call('PEXPIRE', k, ttl) end
end
redis.call('ZREM', lease, ARGV[3])
return 1
";

const USAGE: &str = r"
local t, r, c = usage()
return {t, r, c}
";

static RESERVE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(&format!("{EXPIRE}{RESERVE}")));
static SETTLE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(&format!("{EXPIRE}{SETTLE}")));
static USAGE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(&format!("{EXPIRE}{USAGE}")));

/// The override's marker field and its limit fields, in [`Limits`] order.
const SET: &str = "set";
const FIELDS: [&str; 3] = ["tokens_per_minute", "requests_per_minute", "concurrent_requests"];

/// The [`Ledger`] on the Redis store's shards (module docs).
pub struct RedisLedger {
    shards: Arc<Shards>,
    prefix: String,
    /// Added to the wall clock: tests move time with it.
    offset_ms: AtomicU64,
}

/// Where one scope lives.
struct ScopeKeys {
    shard: ShardId,
    /// [`Scope::key`], as listed in the overrides set.
    scope: String,
    ledger: [String; 4],
    limits: String,
    late: [String; 2],
}

impl ScopeKeys {
    /// `script` with this scope's keys and `now` with the window's cutoff as its first args.
    fn invoke<'s>(&self, script: &'s Script, now: u64, window_ms: u64) -> ScriptInvocation<'s> {
        let mut inv = script.prepare_invoke();
        for key in self.ledger.iter().chain([&self.limits]).chain(&self.late) {
            inv.key(key);
        }
        // i128: a window longer than the epoch is allowed (nothing has left it).
        inv.arg(now).arg(i128::from(now) - i128::from(window_ms));
        inv
    }
}

fn unavailable(shards: &Shards, shard: ShardId, e: impl std::fmt::Display) -> LedgerError {
    LedgerError(format!("redis shard {}: {e}", shards.node(shard).url))
}

/// Runs `script` on `shard`, at once refused while the shard is down.
async fn run<T: redis::FromRedisValue>(shards: &Shards, shard: ShardId, script: &ScriptInvocation<'_>) -> Result<T, LedgerError> {
    if !shards.is_up(shard) {
        return Err(unavailable(shards, shard, "down"));
    }
    shards.script(shard, script).await.map_err(|e| unavailable(shards, shard, e))
}

/// An override as stored (`HGETALL`); `None` when there is none. A field that does not
/// parse is no limit, as the script reads it.
fn parse_limits(h: &HashMap<String, String>) -> Option<Limits> {
    if h.is_empty() {
        return None;
    }
    let f = |name: &str| h.get(name).and_then(|v| v.parse().ok());
    Some(Limits { tokens_per_minute: f(FIELDS[0]), requests_per_minute: f(FIELDS[1]), concurrent_requests: f(FIELDS[2]) })
}

/// The inverse of [`Scope::key`].
fn scope_of(key: &str) -> Scope {
    match key.split_once('\u{1f}') {
        Some((tenant, model)) => Scope { tenant: tenant.into(), model: Some(model.into()) },
        None => Scope { tenant: key.into(), model: None },
    }
}

impl RedisLedger {
    /// A ledger on `shards`, its keys under `prefix` (the store's `key_prefix`).
    pub fn new(shards: Arc<Shards>, prefix: &str) -> RedisLedger {
        RedisLedger { shards, prefix: prefix.to_string(), offset_ms: AtomicU64::new(0) }
    }

    /// Moves this ledger's clock `ms` ahead (tests).
    #[doc(hidden)]
    pub fn advance_clock(&self, ms: u64) {
        self.offset_ms.fetch_add(ms, Ordering::Relaxed);
    }

    fn now_ms(&self) -> u64 {
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        wall.saturating_add(self.offset_ms.load(Ordering::Relaxed))
    }

    fn overrides_key(&self) -> String {
        format!("{}:budget:overrides", self.prefix)
    }

    fn keys(&self, scope: &Scope) -> ScopeKeys {
        let scope = scope.key();
        let key = |what: &str| format!("{}:budget:{{{scope}}}:{what}", self.prefix);
        ScopeKeys {
            shard: self.shards.owner(&scope),
            ledger: [key("log"), key("amt"), key("sum"), key("lease")],
            limits: key("limits"),
            late: [key("late"), key("lamt")],
            scope,
        }
    }

    /// Every override stored on `shard` for a scope it owns.
    async fn overrides_on(shards: &Shards, shard: ShardId, set: &str, limits_key: impl Fn(&str) -> String) -> Result<Vec<(Scope, Limits)>, StoreError> {
        let members: Vec<String> = shards.cmd(shard, redis::cmd("SMEMBERS").arg(set)).await?;
        // A scope listed on a shard that no longer owns it (the shard list changed) is not
        // read by the scripts either.
        let members: Vec<String> = members.into_iter().filter(|m| shards.owner(m) == shard).collect();
        if members.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for m in &members {
            pipe.hgetall(limits_key(m));
        }
        let stored: Vec<HashMap<String, String>> = shards.pipe(shard, &pipe).await?;
        Ok(members.iter().zip(&stored).filter_map(|(m, h)| Some((scope_of(m), parse_limits(h)?))).collect())
    }
}

impl Ledger for RedisLedger {
    fn reserve(&self, r: Reserve) -> LedgerFuture<Outcome> {
        let (shards, keys, now) = (self.shards.clone(), self.keys(&r.scope), self.now_ms());
        Box::pin(async move {
            let limit = |v: Option<u64>| v.map_or_else(String::new, |v| v.to_string());
            let mut inv = keys.invoke(&RESERVE_SCRIPT, now, r.window_ms);
            inv.arg(r.window_ms).arg(now.saturating_add(r.lease_ms)).arg(r.id).arg(r.tokens);
            let Limits { tokens_per_minute, requests_per_minute, concurrent_requests } = r.limits;
            inv.arg(limit(tokens_per_minute)).arg(limit(requests_per_minute)).arg(limit(concurrent_requests));
            inv.arg(r.window_ms.saturating_add(r.lease_ms).max(1)).arg(CONCURRENCY_RETRY_MS);
            let (code, retry_after_ms, tokens, requests, concurrent): (i64, u64, u64, u64, u64) = run(&shards, keys.shard, &inv).await?;
            let usage = Usage { tokens, requests, concurrent };
            match (code, Limit::from_code(code)) {
                (0, _) => Ok(Outcome::Admitted(usage)),
                (_, Some(limit)) => Ok(Outcome::Rejected { limit, retry_after_ms, usage }),
                _ => Err(unavailable(&shards, keys.shard, format_args!("the reserve script answered code {code}"))),
            }
        })
    }

    fn settle(&self, s: Settle) -> LedgerFuture<()> {
        let (shards, keys, now) = (self.shards.clone(), self.keys(&s.scope), self.now_ms());
        Box::pin(async move {
            let mut inv = keys.invoke(&SETTLE_SCRIPT, now, s.window_ms);
            inv.arg(s.id).arg(s.tokens).arg(s.tokens.saturating_sub(s.reserved)).arg(s.window_ms.saturating_add(60_000));
            run::<i64>(&shards, keys.shard, &inv).await.map(drop)
        })
    }

    fn usage(&self, scope: Scope, window_ms: u64) -> LedgerFuture<Usage> {
        let (shards, keys, now) = (self.shards.clone(), self.keys(&scope), self.now_ms());
        Box::pin(async move {
            let inv = keys.invoke(&USAGE_SCRIPT, now, window_ms);
            let (tokens, requests, concurrent) = run(&shards, keys.shard, &inv).await?;
            Ok(Usage { tokens, requests, concurrent })
        })
    }

    fn set_limits(&self, scope: Scope, limits: Option<Limits>) -> LedgerFuture<()> {
        let (shards, keys, set) = (self.shards.clone(), self.keys(&scope), self.overrides_key());
        Box::pin(async move {
            if !shards.is_up(keys.shard) {
                return Err(unavailable(&shards, keys.shard, "down"));
            }
            let mut pipe = redis::pipe();
            pipe.atomic().del(&keys.limits).ignore();
            match limits {
                Some(l) => {
                    let values = [l.tokens_per_minute, l.requests_per_minute, l.concurrent_requests];
                    let mut fields = vec![(SET, 1u64)];
                    fields.extend(FIELDS.iter().zip(values).filter_map(|(f, v)| Some((*f, v?))));
                    pipe.hset_multiple(&keys.limits, &fields).ignore().sadd(&set, &keys.scope).ignore();
                }
                None => {
                    pipe.srem(&set, &keys.scope).ignore();
                }
            }
            shards.pipe::<()>(keys.shard, &pipe).await.map_err(|e| unavailable(&shards, keys.shard, e))
        })
    }

    fn limits_override(&self, scope: Scope) -> LedgerFuture<Option<Limits>> {
        let (shards, keys) = (self.shards.clone(), self.keys(&scope));
        Box::pin(async move {
            if !shards.is_up(keys.shard) {
                return Err(unavailable(&shards, keys.shard, "down"));
            }
            let h: HashMap<String, String> = shards.cmd(keys.shard, redis::cmd("HGETALL").arg(&keys.limits)).await.map_err(|e| unavailable(&shards, keys.shard, e))?;
            Ok(parse_limits(&h))
        })
    }

    /// Reads the shards that are up (a down shard's overrides are left out); fails when none is.
    fn overrides(&self) -> LedgerFuture<Vec<(Scope, Limits)>> {
        let (shards, set, prefix) = (self.shards.clone(), self.overrides_key(), self.prefix.clone());
        Box::pin(async move {
            let limits_key = |scope: &str| format!("{prefix}:budget:{{{scope}}}:limits");
            let (mut all, mut read) = (Vec::new(), 0);
            for shard in shards.ids().filter(|s| shards.is_up(*s)) {
                all.extend(RedisLedger::overrides_on(&shards, shard, &set, &limits_key).await.map_err(|e| unavailable(&shards, shard, e))?);
                read += 1;
            }
            if read == 0 {
                return Err(LedgerError("every redis shard is down".into()));
            }
            all.sort_by(|a, b| a.0.cmp(&b.0));
            Ok(all)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_keys_round_trip() {
        for scope in [Scope { tenant: "a{b}:c".into(), model: None }, Scope { tenant: "t".into(), model: Some("org/m:7b".into()) }] {
            assert_eq!(scope_of(&scope.key()), scope);
        }
    }

    #[test]
    fn stored_overrides_parse_like_the_script_reads_them() {
        let h = |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<HashMap<_, _>>();
        assert_eq!(parse_limits(&h(&[])), None);
        assert_eq!(parse_limits(&h(&[(SET, "1")])), Some(Limits::default()));
        let l = Limits { tokens_per_minute: Some(9), requests_per_minute: None, concurrent_requests: Some(2) };
        assert_eq!(parse_limits(&h(&[(SET, "1"), (FIELDS[0], "9"), (FIELDS[2], "2"), (FIELDS[1], "x")])), Some(l));
    }
}
