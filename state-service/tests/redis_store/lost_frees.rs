//! An assignment freed while the shard that replicates it was away: the `freed` event is lost,
//! and the other replica would keep the assignment's load until a TTL. When the shard returns
//! (empty, as a restarted Redis without persistence does) the other replica's resync finds the
//! record gone and frees its copy (`kvroute_store_reconciled_total`); a replica that freed
//! another's pick meanwhile sends that free again, with a tombstone, so the pick's own replica
//! lets it go too (`kvroute_store_frees_resent_total`). The end of a pick a replica never
//! heard of reaches the replica that recorded it.

use super::support::*;
use serde_json::json;

/// A pick on replica 0, adopted by replica 1; its record's shard stops; the completion
/// reaches replica `reported_on`, which frees its copy while the free cannot be written; the
/// other replica still holds the pick until the shard is back. Returns the replicas.
fn free_while_the_shard_is_away(reported_on: usize) -> Vec<Replica> {
    let mut servers = shards(3);
    let replicas = plain_replicas(&servers, 2);
    let rt = client_rt();
    let count = |r: &Replica| r.state.fleet.assignments().len();
    let (status, resp) = post_json(&rt, &replicas[0].url("/v1/pick"), json!({ "model": "m", "token_keys": [1, 2], "block_size": 16, "prompt_tokens": 32 }));
    assert_eq!(status, 200, "{resp}");
    let id = resp["assignment_id"].as_u64().expect("assignment");
    wait_until("replica 1 to adopt the pick", || count(&replicas[1]) == 1);
    let owner = replicas[0].store.shards.owner(&format!("t:asg:{id}"));
    servers[owner.0].stop();
    wait_until("the reporting replica to see the shard down", || !replicas[reported_on].store.shards.is_up(owner));
    let report = json!({ "reports": [{ "assignment_id": id, "kind": 2, "elapsed_ms": 5.0 }] });
    assert_eq!(post_json(&rt, &replicas[reported_on].url("/v1/report"), report).0, 204);
    assert_eq!(count(&replicas[reported_on]), 0);
    let other = 1 - reported_on;
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(count(&replicas[other]), 1, "the lost free: the other replica still holds the pick");
    servers[owner.0].restart();
    wait_until("the other replica to let the pick go", || count(&replicas[other]) == 0);
    replicas
}

#[test]
fn a_free_lost_with_its_shard_is_reconciled_when_the_shard_returns() {
    // Completed on the pick's own replica: replica 1's resync finds the record gone.
    let replicas = free_while_the_shard_is_away(0);
    assert!(replicas[1].store.stats.reconciled.load(std::sync::atomic::Ordering::Relaxed) >= 1);
}

#[test]
fn a_free_of_another_replicas_pick_made_while_its_shard_was_away_reaches_that_replica() {
    // Completed on replica 1 (the proxy's report went there): it sends the free again, with a
    // tombstone, once the shard is back.
    let replicas = free_while_the_shard_is_away(1);
    assert!(replicas[1].store.stats.frees_resent.load(std::sync::atomic::Ordering::Relaxed) >= 1);
}

#[test]
fn the_end_of_a_pick_a_replica_never_heard_of_reaches_the_replica_that_recorded_it() {
    let mut servers = shards(3);
    let replicas = plain_replicas(&servers, 2);
    let rt = client_rt();
    let count = |r: &Replica| r.state.fleet.assignments().len();
    // A pick whose record's shard is away: replica 1 never hears of it.
    let shard = replicas[0].store.shards.owner("t:asg:777");
    servers[shard.0].stop();
    wait_until("both replicas to see the shard down", || replicas.iter().all(|r| !r.store.shards.is_up(shard)));
    let pick = json!({ "model": "m", "token_keys": [1, 2], "block_size": 16, "prompt_tokens": 32, "assignment_id": 777 });
    assert_eq!(post_json(&rt, &replicas[0].url("/v1/pick"), pick).0, 200);
    servers[shard.0].restart();
    wait_until("both replicas to see the shard back", || replicas.iter().all(|r| r.store.shards.is_up(shard)));
    assert_eq!((count(&replicas[0]), count(&replicas[1])), (1, 0));
    // Its completion reaches replica 1, which does not hold it: replica 0 lets it go.
    let report = json!({ "reports": [{ "assignment_id": 777, "kind": 2, "elapsed_ms": 5.0 }] });
    assert_eq!(post_json(&rt, &replicas[1].url("/v1/report"), report).0, 204);
    wait_until("replica 0 to free its pick", || count(&replicas[0]) == 0);
}
