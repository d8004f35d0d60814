//! A Redis shard dies under load: no pick fails, picks are marked degraded
//! (`state_unavailable`) and counted, and when the shard returns (empty) the replicas
//! recover and the lease holder rewrites the mirror that lived there.

use super::sims::*;
use super::support::*;
use kvroute_state::store::redis::{mirror, MirrorKey};
use serde_json::json;

fn pick(rt: &tokio::runtime::Runtime, r: &Replica, model: &str, i: u64) -> serde_json::Value {
    let body = json!({ "model": model, "token_keys": [i, i + 1, i + 2], "block_size": 16, "prompt_tokens": 48 });
    let (status, resp) = post_json(rt, &r.url("/v1/pick"), body);
    assert_eq!(status, 200, "{resp}");
    assert!(resp["worker_id"].as_str().is_some_and(|w| !w.is_empty()), "routed: {resp}");
    resp
}

#[test]
fn a_dead_shard_degrades_picks_and_recovers() {
    let mut servers = shards(3);
    let sims = Sims::start(1);
    let model = sims.layout[0].model.clone();
    let replicas: Vec<Replica> = (0..2)
        .map(|i| {
            let mut c = redis_config(&servers, &format!("r{i}"), i);
            sims.add_workers(&mut c);
            Replica::start(c)
        })
        .collect();
    let rt = client_rt();
    settle_subscription(&sims, |_| replicas.iter().all(|r| !r.hashes("w0").is_empty()));
    let load = sims.load(3);
    let key = MirrorKey::new("t", "w0", 0);
    let owner = replicas[0].store.shards.owner(&key.blocks);
    let read_mirror = || {
        let _g = rt.enter();
        rt.block_on(mirror::load(&replicas[0].store.shards, owner, &key)).ok()
    };
    wait_until("the mirror to exist", || read_mirror().is_some_and(|m| !m.blocks.is_empty()));
    let mut n = 0u64;
    for r in replicas.iter().cycle().take(20) {
        n += 1;
        assert_eq!(pick(&rt, r, &model, n)["degraded_reason"], "");
    }

    servers[owner.0].stop();
    // Picks keep answering; once the probe notices, they say why they are degraded.
    wait_until("picks to be marked degraded", || {
        n += 1;
        replicas.iter().all(|r| pick(&rt, r, &model, n)["degraded_reason"] == "state_unavailable")
    });
    for r in replicas.iter().cycle().take(50) {
        n += 1;
        assert_eq!(pick(&rt, r, &model, n)["degraded_reason"], "state_unavailable");
    }
    let metrics = rt.block_on(async { reqwest::get(replicas[0].url("/metrics")).await.expect("up").text().await.expect("text") });
    assert!(metrics.contains("reason=\"state_unavailable\""), "counted");
    assert!(metrics.contains("kvroute_store_shard_up{shard="), "shard health exported");

    servers[owner.0].restart();
    wait_until("picks to recover", || {
        n += 1;
        replicas.iter().all(|r| pick(&rt, r, &model, n)["degraded_reason"] == "")
    });
    load.finish(&sims);
    let (truth, next) = sims.state(0);
    wait_until("the mirror to be rewritten", || {
        read_mirror().is_some_and(|m| m.seq == Some(next - 1) && m.blocks.iter().map(|b| b.hash.0).collect::<Vec<_>>() == truth)
    });
    let dropped: u64 = replicas.iter().map(|r| r.store.stats.dropped()).sum();
    assert!(dropped > 0, "writes for the dead shard were dropped and counted");
}
