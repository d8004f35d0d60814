//! The Redis budget ledger against real `redis-server`s: the ledger contract (the cases the
//! memory ledger meets), two replicas sharing one token budget from many concurrent tasks,
//! and lost shards failing calls within the shard timeout, then recovering (the restarted,
//! empty shard loads the scripts again).

use super::proxy::Proxy;
use super::support::*;
use kvroute_state::store::redis::shards::{ShardId, Shards};
use kvroute_state::store::redis::{RedisLedger, RedisStore};
use kvroute_state::tenancy::window::contract::{self, reserve, scope};
use kvroute_state::tenancy::{Ledger, Limit, Limits, Outcome};
use std::sync::Arc;
use std::time::Duration;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

fn ledger(urls: &[String], timeout: Duration) -> (Arc<Shards>, Arc<RedisLedger>) {
    let shards = Arc::new(Shards::new(urls, timeout).expect("shards"));
    (shards.clone(), Arc::new(RedisLedger::new(shards, "t")))
}

/// A tenant name starting with `prefix` whose scope lives on `shard`.
fn tenant_on(shards: &Shards, shard: usize, prefix: &str) -> String {
    (0..).map(|i| format!("{prefix}{i}")).find(|t| shards.owner(&scope(t).key()).0 == shard).expect("some name lands there")
}

#[test]
fn redis_ledger_meets_the_contract() {
    let servers = shards(2);
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    runtime().block_on(async {
        let (shards, l) = ledger(&urls, Duration::from_secs(2));
        for shard in 0..2 {
            contract::tokens_window(l.as_ref(), &tenant_on(&shards, shard, "tok"), |ms| {
                l.advance_clock(ms);
                async {}
            })
            .await;
            contract::requests_and_concurrency(l.as_ref(), &tenant_on(&shards, shard, "req")).await;
            contract::overrides(l.as_ref(), &tenant_on(&shards, shard, "ovr")).await;
            contract::late_settles_are_charged_when_they_happen(l.as_ref(), &tenant_on(&shards, shard, "late"), |ms| {
                l.advance_clock(ms);
                async {}
            })
            .await;
        }

        // The scripts are loaded again when a shard forgot them (restart, SCRIPT FLUSH).
        let t = tenant_on(&shards, 1, "flush");
        let mut direct = redis::Client::open(urls[1].as_str()).and_then(|c| c.get_connection()).expect("connect");
        redis::cmd("SCRIPT").arg("FLUSH").query::<()>(&mut direct).expect("flushed");
        let one = Limits { requests_per_minute: Some(1), ..Limits::default() };
        assert!(matches!(l.reserve(reserve(&scope(&t), 1, 5, one)).await.expect("reloaded"), Outcome::Admitted(_)));
        // An idle scope leaves nothing behind: its keys expire after window + lease; an
        // override does not.
        let mut ttl = |key: String| redis::cmd("PTTL").arg(key).query::<i64>(&mut direct).expect("pttl");
        for what in ["log", "amt", "sum", "lease"] {
            let left = ttl(format!("t:budget:{{{t}}}:{what}"));
            assert!(left > 0 && left <= 660_000, "{what} expires: {left}");
        }
        l.set_limits(scope(&t), Some(Limits::default())).await.expect("set");
        assert_eq!(ttl(format!("t:budget:{{{t}}}:limits")), -1, "an override stays");
        assert_eq!(l.limits_override(scope(&t)).await.expect("read"), Some(Limits::default()), "an all-unlimited override exists");

        // The store hands out a ledger on its own shards and key prefix.
        let store = RedisStore::connect(&redis_config(&servers, "r", 1)).await.expect("store");
        let shared: Arc<dyn Ledger> = store.ledger.clone();
        contract::requests_and_concurrency(shared.as_ref(), "via-store").await;
    });
}

#[test]
fn two_replicas_never_overspend_one_token_budget() {
    const LIMIT: u64 = 5_000;
    const MAX_SIZE: u64 = 50;
    let servers = shards(2);
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let rt = runtime();
    let (admitted, count, usage) = rt.block_on(async {
        // Two replicas: their own connections, the same shards.
        let replicas = [ledger(&urls, Duration::from_secs(5)).1, ledger(&urls, Duration::from_secs(5)).1];
        let s = scope("shared");
        let limits = Limits { tokens_per_minute: Some(LIMIT), ..Limits::default() };
        let mut tasks = Vec::new();
        for task in 0..32u64 {
            let (l, s) = (replicas[task as usize % 2].clone(), s.clone());
            tasks.push(tokio::spawn(async move {
                let (mut tokens, mut n) = (0, 0);
                for i in 0.. {
                    let size = 1 + (task * 7 + i * 13) % MAX_SIZE;
                    match l.reserve(reserve(&s, task << 32 | i, size, limits)).await.expect("reserve") {
                        Outcome::Admitted(u) => {
                            assert!(u.tokens <= LIMIT, "admitted past the limit: {u:?}");
                            (tokens, n) = (tokens + size, n + 1);
                        }
                        Outcome::Rejected { limit: Limit::Tokens, .. } => break,
                        other => panic!("only tokens limit: {other:?}"),
                    }
                }
                (tokens, n)
            }));
        }
        let (mut tokens, mut n) = (0, 0);
        for t in tasks {
            let (a, b) = t.await.expect("task");
            (tokens, n) = (tokens + a, n + b);
        }
        (tokens, n, replicas[0].usage(s, 60_000).await.expect("usage"))
    });
    eprintln!("two replicas, 32 tasks: {count} reservations admitted, {admitted} of {LIMIT} tokens");
    assert!(admitted <= LIMIT, "overspent: {admitted}");
    assert!(LIMIT - admitted < MAX_SIZE, "every task stopped only when its reservation no longer fit: {admitted}");
    assert_eq!((usage.tokens, usage.requests), (admitted, count), "the ledger charged exactly what was admitted");
}

#[test]
fn a_lost_shard_fails_reservations_within_its_timeout() {
    let mut servers = shards(2);
    let proxy = Proxy::start(servers[0].port);
    let urls = vec![proxy.url(), servers[1].url()];
    let timeout = Duration::from_millis(200);
    let rt = runtime();
    rt.block_on(async {
        let (shards, l) = ledger(&urls, timeout);
        let (held, stopped) = (scope(&tenant_on(&shards, 0, "held")), scope(&tenant_on(&shards, 1, "stopped")));
        let limits = Limits { tokens_per_minute: Some(1_000), ..Limits::default() };
        let mut id = 0;
        let mut try_reserve = |s: &kvroute_state::tenancy::Scope| {
            id += 1;
            // Far past the shard timeout: a hang fails here instead of stalling the test.
            tokio::time::timeout(Duration::from_secs(10), l.reserve(reserve(s, id, 1, limits)))
        };
        assert!(try_reserve(&held).await.expect("answered").is_ok() && try_reserve(&stopped).await.expect("answered").is_ok());

        // Black-holed: the call times out; a stopped server refuses. Both are errors, and
        // the shard is then down: the next call fails at once, the other shard still works.
        proxy.pause(true);
        let err = try_reserve(&held).await.expect("bounded by the shard timeout").expect_err("black-holed");
        eprintln!("black-holed shard: {err}");
        servers[1].stop();
        try_reserve(&stopped).await.expect("answered").expect_err("stopped shard");
        assert!(!shards.is_up(ShardId(0)) && !shards.is_up(ShardId(1)));
        try_reserve(&stopped).await.expect("answered").expect_err("down: refused at once");

        // Back (shard 1 empty, its script cache too) once a probe sees it.
        proxy.pause(false);
        servers[1].restart();
        for shard in shards.ids() {
            let deadline = tokio::time::Instant::now() + DEADLINE;
            while !shards.is_up(shard) {
                assert!(tokio::time::Instant::now() < deadline, "shard {} never came back", shard.0);
                shards.probe(shard).await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        for s in [&held, &stopped] {
            assert!(matches!(try_reserve(s).await.expect("answered").expect("back"), Outcome::Admitted(_)));
        }
    });
}

/// Budgets as the service runs them on Redis: an override made through one replica holds on
/// the other (its limits at once, its scope after a refresh), and with the ledger unreachable
/// a service set to reject answers "unavailable" while one set to `local` admits its share.
#[test]
fn replicas_share_overrides_and_follow_the_unavailable_policy() {
    use kvroute_core::wire::BudgetLimit;
    use kvroute_state::metrics::Registry;
    use kvroute_state::tenancy::{Admission, Charge, TenancyConfig, Tenants, WhenUnavailable};
    let mut servers = shards(1);
    let urls = vec![servers[0].url()];
    runtime().block_on(async {
        let tenants = |when: WhenUnavailable| {
            let (_, l) = ledger(&urls, Duration::from_millis(300));
            let config = TenancyConfig { when_store_unavailable: when, replicas: 2, store_timeout_ms: 1_000, ..TenancyConfig::default() };
            let mut registry = Registry::default();
            (Tenants::new(config, Some(l as Arc<dyn Ledger>), 600_000, &mut registry), registry)
        };
        let ((a, _), (b, b_metrics), (local, local_metrics)) =
            (tenants(WhenUnavailable::Reject), tenants(WhenUnavailable::Reject), tenants(WhenUnavailable::Local));
        let charge = |id: u64| Charge { tenant: "newbie", model: "m", id, tokens: 10 };
        assert_eq!(b.admit(&charge(1)).await, Admission::Unlimited, "nobody budgets newbie yet");
        a.set_limits("newbie", None, Some(Limits { requests_per_minute: Some(2), ..Limits::default() })).await.expect("override stored");
        b.refresh().await.expect("refreshed");
        assert!(matches!(b.admit(&charge(2)).await, Admission::Admitted { degraded: false, .. }), "b follows a's override");
        assert!(matches!(a.admit(&charge(3)).await, Admission::Admitted { .. }));
        match b.admit(&charge(4)).await {
            Admission::Rejected(r) => assert_eq!(r.limit(), BudgetLimit::BudgetRequests, "one budget for both: 2 per minute"),
            other => panic!("expected a rejection, got {other:?}"),
        }

        local.refresh().await.expect("refreshed");
        servers[0].stop();
        match b.admit(&charge(5)).await {
            Admission::Rejected(r) => assert_eq!(r.limit(), BudgetLimit::BudgetUnavailable),
            other => panic!("reject policy: expected unavailable, got {other:?}"),
        }
        // The local share of 2 rpm over 2 replicas: 1 admitted here, then rejected.
        assert!(matches!(local.admit(&charge(6)).await, Admission::Admitted { degraded: true, .. }));
        assert!(matches!(local.admit(&charge(7)).await, Admission::Rejected(_)));
        assert!(b_metrics.encode().contains("kvroute_budget_degraded_total 1\n"), "b decided one without the ledger");
        assert!(local_metrics.encode().contains("kvroute_budget_degraded_total 2\n"), "local decided two without the ledger");
    });
}
