//! A slow (not dead) shard does not throttle the others' writes: with every chunk to and from
//! one of three shards delayed 300 ms (a round trip 600 ms, inside the raised timeout), the
//! assignment records of picks owned by the two healthy shards still land within
//! milliseconds (one writer for all shards made them wait for the slow round trip), the slow shard stays up (picks are not degraded), and its own records arrive
//! late or are counted dropped.

use super::proxy::Proxy;
use super::support::*;
use serde_json::json;
use std::time::{Duration, Instant};

const PICKS: u64 = 30;
const DELAY: Duration = Duration::from_millis(300);

fn exists(conn: &mut redis::Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query::<bool>(conn).expect("direct redis call")
}

#[test]
fn a_slow_shard_does_not_delay_the_other_shards_writes() {
    let servers = shards(3);
    let proxy = Proxy::start(servers[0].port);
    let mut c = redis_config(&servers, "slow", 1);
    c.redis.urls[0] = proxy.url();
    c.redis.timeout_ms = 3_000;
    plain_workers(&mut c, 4);
    let replica = Replica::start(c);
    let direct: Vec<redis::Client> = servers.iter().map(|s| redis::Client::open(s.url()).expect("url")).collect();
    let mut conns: Vec<redis::Connection> = direct.iter().map(|c| c.get_connection().expect("connect")).collect();
    let rt = client_rt();
    proxy.set_delay(DELAY);

    let (mut healthy, mut slow) = (Vec::new(), Vec::new());
    for i in 0..PICKS {
        let keys: Vec<u64> = (0..4).map(|b| (i + 1) << 32 | b).collect();
        let body = json!({ "model": "m", "token_keys": keys, "block_size": 16, "prompt_tokens": 64 });
        let (status, resp) = post_json(&rt, &replica.url("/v1/pick"), body);
        let picked = Instant::now();
        assert_eq!(status, 200, "{resp}");
        assert_eq!(resp["degraded_reason"], "", "a slow shard is not a dead one: {resp}");
        let key = format!("t:asg:{}", resp["assignment_id"].as_u64().expect("id"));
        let owner = replica.store.shards.owner(&key).0;
        if owner == 0 {
            slow.push(key);
            continue;
        }
        while !exists(&mut conns[owner], &key) {
            assert!(picked.elapsed() < Duration::from_secs(5), "{key} never reached shard {owner}");
            std::thread::sleep(Duration::from_millis(1));
        }
        healthy.push(picked.elapsed());
    }
    healthy.sort_unstable();
    let (p50, max) = (healthy[healthy.len() / 2], healthy[healthy.len() - 1]);
    eprintln!("healthy-shard write latency with a slow shard ({} healthy, {} slow picks): p50 {p50:?}, max {max:?}", healthy.len(), slow.len());
    assert!(healthy.len() >= 5 && !slow.is_empty(), "picks spread over the shards: {} healthy, {} slow", healthy.len(), slow.len());
    // Serial writes would wait out a 600 ms round trip to the slow shard; the margin is for
    // a loaded machine.
    assert!(max < Duration::from_millis(300), "healthy shards' writes waited for the slow one: p50 {p50:?}, max {max:?}");

    // The slow shard's records arrive (late) or are counted dropped.
    wait_until("the slow shard's writes to land or be counted", || {
        let landed = slow.iter().filter(|k| exists(&mut conns[0], k)).count() as u64;
        landed + replica.store.stats.dropped() >= slow.len() as u64
    });
}
