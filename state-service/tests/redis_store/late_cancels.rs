//! No phantom load after a freeze: the proxy gives up on a pick a replica answers late (it was
//! slow, or frozen) and cancels it by its id, and the cancel may reach another replica, which
//! never recorded that id, before or after the pick is recorded. Either way the replica that
//! answered the pick lets it go: the cancel is shared, remembered where the pick is not
//! recorded yet, and frees it where it is. A replica that could not hear the cancel (it was
//! frozen, or its subscription was lost) finds it as a tombstone when it resyncs.

use super::support::*;
use serde_json::json;

fn pick(id: u64) -> serde_json::Value {
    json!({ "model": "m", "token_keys": [1, 2], "block_size": 16, "prompt_tokens": 32, "assignment_id": id })
}

fn cancel(id: u64) -> serde_json::Value {
    json!({ "reports": [{ "assignment_id": id, "kind": 3 }] })
}

#[test]
fn a_cancel_heard_by_another_replica_frees_the_pick_in_either_order() {
    let servers = shards(2);
    let replicas = plain_replicas(&servers, 2);
    let rt = client_rt();
    let count = |r: &Replica| r.state.fleet.assignments().len();

    // The cancel first (the proxy gave up before replica 0 answered), to replica 1; replica 0
    // hears of it, then answers the pick: discarded, nothing recorded anywhere.
    let received = |r: &Replica| r.store.stats.received.load(std::sync::atomic::Ordering::Relaxed);
    let before = received(&replicas[0]);
    assert_eq!(post_json(&rt, &replicas[1].url("/v1/report"), cancel(0xC0FFEE)).0, 204);
    wait_until("replica 0 to hear of the cancel", || received(&replicas[0]) > before);
    assert_eq!(post_json(&rt, &replicas[0].url("/v1/pick"), pick(0xC0FFEE)).0, 200);
    assert!(replicas[0].state.metrics.encode().contains("kvroute_picks_abandoned_total 1"), "the pick was discarded");
    assert_eq!((count(&replicas[0]), count(&replicas[1])), (0, 0));

    // The pick first (recorded on replica 0 and adopted by replica 1)...
    let (status, _) = post_json(&rt, &replicas[0].url("/v1/pick"), pick(0xBEEF));
    assert_eq!(status, 200);
    wait_until("replica 1 to adopt the pick", || count(&replicas[1]) == 1);
    // ... then the cancel, to replica 1: both let it go.
    assert_eq!(post_json(&rt, &replicas[1].url("/v1/report"), cancel(0xBEEF)).0, 204);
    wait_until("the pick freed on both replicas", || count(&replicas[0]) == 0 && count(&replicas[1]) == 0);
}

#[test]
fn a_cancel_a_replica_could_not_hear_is_found_when_it_resyncs() {
    let servers = shards(1);
    let replicas = plain_replicas(&servers, 2);
    let rt = client_rt();
    let count = |r: &Replica| r.state.fleet.assignments().len();

    // The proxy gave up on pick 0xDEAD; its cancel reached replica 1, which never saw the
    // pick, and a replica that was not listening then starts (or resubscribes) later.
    assert_eq!(post_json(&rt, &replicas[1].url("/v1/report"), cancel(0xDEAD)).0, 204);
    wait_until("the tombstone", || servers[0].inline("EXISTS t:cxl:57005").is_some_and(|r| r.starts_with(":1")));
    let mut c = redis_config(&servers, "r2", 2);
    plain_workers(&mut c, 2);
    let late = Replica::start(c);
    let id = kvroute_state::assign::AssignmentId(0xDEAD);
    wait_until("the late replica to read the tombstone", || late.state.fleet.assignments().cancelled_early(id));
    assert_eq!(post_json(&rt, &late.url("/v1/pick"), pick(0xDEAD)).0, 200);
    assert!(late.state.metrics.encode().contains("kvroute_picks_abandoned_total 1"), "the pick was discarded");
    assert_eq!(count(&late), 0);

    // A replica that recorded a pick and missed its cancel (here: written while its
    // subscription is cut) frees it when it resubscribes, and so does every replica.
    assert_eq!(post_json(&rt, &replicas[0].url("/v1/pick"), pick(0xF00D)).0, 200);
    wait_until("every replica to hold the pick", || [&replicas[0], &replicas[1], &late].iter().all(|r| count(r) == 1));
    assert!(servers[0].inline("SET t:cxl:61453 61453 PX 60000").is_some_and(|r| r.starts_with("+OK")));
    assert!(servers[0].inline("CLIENT KILL TYPE pubsub").is_some_and(|r| r.starts_with(':')));
    wait_until("the missed cancel to free the pick everywhere", || [&replicas[0], &replicas[1], &late].iter().all(|r| count(r) == 0));
}

#[test]
fn the_end_of_a_pick_reported_to_a_replica_that_does_not_hold_it_settles_its_budget() {
    use kvroute_state::tenancy::window::contract::scope;
    use kvroute_state::tenancy::{Budget, Ledger};
    let mut servers = shards(3);
    let replicas: Vec<Replica> = (0..2)
        .map(|i| {
            let mut c = redis_config(&servers, &format!("r{i}"), i);
            plain_workers(&mut c, 2);
            c.tenancy.budgets.insert("team".into(), Budget { tokens_per_minute: Some(1_000_000), ..Budget::default() });
            Replica::start(c)
        })
        .collect();
    let rt = client_rt();
    let count = |r: &Replica| r.state.fleet.assignments().len();
    let used = || rt.block_on(replicas[0].store.ledger.usage(scope("team"), 60_000)).expect("usage").tokens;
    // Two picks replica 1 never hears of: their records' shard is away (not the budget's).
    let shards = &replicas[0].store.shards;
    let budget = shards.owner(&scope("team").key());
    let away = shards.ids().find(|s| *s != budget).expect("another shard");
    let ids: Vec<u64> = (1..).filter(|id| shards.owner(&format!("t:asg:{id}")) == away).take(2).collect();
    servers[away.0].stop();
    wait_until("both replicas to see the shard down", || replicas.iter().all(|r| !r.store.shards.is_up(away)));
    for id in &ids {
        let mut body = pick(*id);
        body["tenant"] = json!("team");
        body["max_tokens"] = json!(100);
        assert_eq!(post_json(&rt, &replicas[0].url("/v1/pick"), body).0, 200);
    }
    servers[away.0].restart();
    wait_until("both replicas to see the shard back", || replicas.iter().all(|r| r.store.shards.is_up(away)));
    assert_eq!((count(&replicas[0]), count(&replicas[1])), (2, 0));
    let reserved = used();
    assert!(reserved > 0, "the picks reserved their tokens");

    // The proxy gave up on the first pick (never forwarded): its cancel reaches replica 1,
    // and replica 0 gives the reservation back. The second completed, with its usage: it is
    // charged what the engine did (32 - 16 cached + 7), not its reservation.
    let reports = json!({ "reports": [
        { "assignment_id": ids[0], "kind": 3, "tenant": "team" },
        { "assignment_id": ids[1], "kind": 2, "elapsed_ms": 5.0, "tenant": "team", "status": 200,
          "prompt_tokens": 32, "cached_tokens": 16, "completion_tokens": 7 },
    ] });
    assert_eq!(post_json(&rt, &replicas[1].url("/v1/report"), reports).0, 204);
    wait_until("replica 0 to free both picks", || count(&replicas[0]) == 0);
    wait_until("both settled by how they ended", || used() == 23);
}
