//! A half-open shard: the proxy in front of one of three shards stops forwarding without
//! closing any socket (a black-holed link). Within a few heartbeats both replicas report
//! degraded (store and `/metrics`), their subscriptions time out (counted), and once the link
//! heals they recover: not degraded, and an assignment picked on one replica, whose record
//! lives on that shard, reaches the other again.

use super::proxy::Proxy;
use super::support::*;
use kvroute_state::assign::AssignmentId;
use serde_json::json;
use std::sync::atomic::Ordering;
use std::time::Instant;

const HEARTBEAT_MS: u64 = 200;

/// Picks on `r` until one's record lives on shard 0 (the proxied one); returns its id.
fn pick_on_shard0(rt: &tokio::runtime::Runtime, r: &Replica, next: &mut u64) -> u64 {
    loop {
        *next += 1;
        let body = json!({ "model": "m", "token_keys": [*next << 32, *next << 32 | 1], "block_size": 16, "prompt_tokens": 32 });
        let (status, resp) = post_json(rt, &r.url("/v1/pick"), body);
        assert_eq!(status, 200, "{resp}");
        let id = resp["assignment_id"].as_u64().expect("id");
        if r.store.shards.owner(&format!("t:asg:{id}")).0 == 0 {
            return id;
        }
    }
}

fn metrics(rt: &tokio::runtime::Runtime, r: &Replica) -> String {
    rt.block_on(async { reqwest::get(r.url("/metrics")).await.expect("up").text().await.expect("text") })
}

fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines().find(|l| l.starts_with(name)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok())
}

#[test]
fn a_black_holed_subscription_is_noticed_and_renewed() {
    let servers = shards(3);
    let proxy = Proxy::start(servers[0].port);
    let replicas: Vec<Replica> = ["ha", "hb"]
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let mut c = redis_config(&servers, name, i as u64 + 1);
            c.redis.urls[0] = proxy.url();
            c.redis.heartbeat_ms = HEARTBEAT_MS;
            plain_workers(&mut c, 2);
            Replica::start(c)
        })
        .collect();
    let (a, b) = (&replicas[0], &replicas[1]);
    let rt = client_rt();
    let mut next = 0;
    wait_until("both replicas healthy", || replicas.iter().all(|r| !r.store.degraded()));
    let id = pick_on_shard0(&rt, a, &mut next);
    wait_until("the pick to replicate through the proxied shard", || b.state.fleet.assignments().contains(AssignmentId(id)));
    let timeouts = |r: &Replica| r.store.stats.subscription_timeouts.load(Ordering::Relaxed);
    // Five heartbeats, over one and a half silence windows: nothing times out on a healthy link.
    std::thread::sleep(std::time::Duration::from_millis(5 * HEARTBEAT_MS));
    assert_eq!(replicas.iter().map(timeouts).sum::<u64>(), 0, "heartbeats keep healthy subscriptions alive");

    proxy.pause(true);
    let cut = Instant::now();
    wait_until("both replicas degraded, their subscriptions timed out", || {
        replicas.iter().all(|r| r.store.degraded() && timeouts(r) > 0 && !r.store.shards.is_subscribed(kvroute_state::store::redis::shards::ShardId(0)))
    });
    eprintln!("half-open shard noticed by both subscriptions after {:?} (heartbeat {HEARTBEAT_MS} ms)", cut.elapsed());
    let m = metrics(&rt, a);
    assert!(metric_value(&m, "kvroute_store_subscription_timeouts_total").is_some_and(|v| v >= 1.0), "exported:\n{m}");
    assert!(m.lines().any(|l| l.starts_with("kvroute_store_shard_subscribed{") && l.ends_with(" 0")), "subscription state exported:\n{m}");
    let body = json!({ "model": "m", "token_keys": [1u64 << 40], "block_size": 16, "prompt_tokens": 16 });
    let (_, resp) = post_json(&rt, &a.url("/v1/pick"), body);
    assert_eq!(resp["degraded_reason"], "state_unavailable", "{resp}");

    proxy.pause(false);
    let healed = Instant::now();
    wait_until("both replicas to recover", || replicas.iter().all(|r| !r.store.degraded()));
    eprintln!("recovered {:?} after the link healed", healed.elapsed());
    let id = pick_on_shard0(&rt, a, &mut next);
    wait_until("a pick to replicate through the healed shard again", || b.state.fleet.assignments().contains(AssignmentId(id)));
    assert!(replicas.iter().all(|r| r.store.stats.bad_messages.load(Ordering::Relaxed) == 0), "heartbeats are not bad messages");
}
