//! A restarted replica answers from the workers' real caches before any new event: it loads
//! the mirror the lease holder kept while it was away. And with no lease holder at all (the
//! mirror stale), it catches up through vLLM replay from the mirror's seq, still without a new
//! event.

use super::sims::*;
use super::support::*;
use kvroute_state::store::redis::{mirror, MirrorKey};

fn mirror_seq(r: &Replica, worker: &str) -> Option<u64> {
    let key = MirrorKey::new("t", worker, 0);
    let shards = &r.store.shards;
    let rt = client_rt();
    let _g = rt.enter();
    rt.block_on(mirror::load(shards, shards.owner(&key.blocks), &key)).ok().and_then(|m| m.seq)
}

#[test]
fn restarted_replica_equals_the_workers_caches_before_any_new_event() {
    let servers = shards(3);
    let sims = Sims::start(2);
    let config = |name: &str, seed| {
        let mut c = redis_config(&servers, name, seed);
        sims.add_workers(&mut c);
        c
    };
    let a = Replica::start(config("a", 1));
    settle_subscription(&sims, |i| !a.hashes(&format!("w{i}")).is_empty());
    let load = sims.load(1);
    let b = Replica::start(config("b", 2));
    wait_until("b to ingest", || !b.hashes("w0").is_empty() && !b.hashes("w1").is_empty());
    drop(b);
    let seqs: Vec<u64> = (0..2).map(|i| sims.state(i).1).collect();
    wait_for_events(&sims, &seqs, 40);
    load.finish(&sims);
    let truth: Vec<(Vec<u64>, u64)> = (0..2).map(|i| sims.state(i)).collect();
    for (i, (_, next)) in truth.iter().enumerate() {
        wait_until("the lease holder's mirror to catch up", || mirror_seq(&a, &format!("w{i}")) == Some(next - 1));
    }
    for (i, (hashes, _)) in truth.iter().enumerate() {
        assert_eq!(&a.hashes(&format!("w{i}")), hashes, "w{i}: the lease holder's own index");
    }
    let b = Replica::start(config("b", 2));
    // Right after start: no event has been published since `truth` was taken.
    for (i, (hashes, next)) in truth.iter().enumerate() {
        let w = format!("w{i}");
        assert!(!hashes.is_empty());
        assert_eq!(&b.hashes(&w), hashes, "{w}: warm-started index vs the worker's cache");
        assert_eq!(sims.state(i).1, *next, "no new event");
    }

    // No replica left: the mirror goes stale while the workers keep publishing.
    drop((a, b));
    let seqs: Vec<u64> = (0..2).map(|i| sims.state(i).1).collect();
    let load = sims.load(2);
    wait_for_events(&sims, &seqs, 40);
    load.finish(&sims);
    let truth: Vec<(Vec<u64>, u64)> = (0..2).map(|i| sims.state(i)).collect();
    let b = Replica::start(config("b", 2));
    for (i, (hashes, next)) in truth.iter().enumerate() {
        let w = format!("w{i}");
        wait_until("replay from the mirror's seq", || &b.hashes(&w) == hashes);
        assert_eq!(sims.state(i).1, *next, "caught up by replay alone, without a new event");
    }
}
