//! An assignment freed while the shard that replicates it was away: the `freed` event is lost,
//! and the other replica would keep the assignment's load until a TTL. When the shard returns
//! (empty, as a restarted Redis without persistence does) the other replica's resync finds the
//! record gone and frees its copy (`kvroute_store_reconciled_total`).

use super::support::*;
use serde_json::json;

#[test]
fn a_free_lost_with_its_shard_is_reconciled_when_the_shard_returns() {
    let mut servers = shards(3);
    let replicas = plain_replicas(&servers, 2);
    let rt = client_rt();
    let count = |r: &Replica| r.state.fleet.assignments().len();
    // A pick on replica 0 whose record lives on some shard; replica 1 adopts it.
    let (status, resp) = post_json(&rt, &replicas[0].url("/v1/pick"), json!({ "model": "m", "token_keys": [1, 2], "block_size": 16, "prompt_tokens": 32 }));
    assert_eq!(status, 200, "{resp}");
    let id = resp["assignment_id"].as_u64().expect("assignment");
    wait_until("replica 1 to adopt the pick", || count(&replicas[1]) == 1);
    let owner = replicas[0].store.shards.owner(&format!("t:asg:{id}"));
    servers[owner.0].stop();
    wait_until("replica 0 to see the shard down", || !replicas[0].store.shards.is_up(owner));
    // Completed on replica 0 while its shard is away: the free is not replicated.
    let report = json!({ "reports": [{ "assignment_id": id, "kind": 2, "elapsed_ms": 5.0 }] });
    let (status, _) = post_json(&rt, &replicas[0].url("/v1/report"), report);
    assert_eq!(status, 204);
    assert_eq!(count(&replicas[0]), 0);
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(count(&replicas[1]), 1, "the lost free: replica 1 still holds it");
    servers[owner.0].restart();
    wait_until("replica 1 to reconcile on resync", || count(&replicas[1]) == 0);
    assert!(replicas[1].store.stats.reconciled.load(std::sync::atomic::Ordering::Relaxed) >= 1);
}
