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
fn a_pick_freed_by_a_cancel_heard_elsewhere_gives_its_budget_back() {
    use kvroute_state::tenancy::window::contract::scope;
    use kvroute_state::tenancy::{Budget, Ledger};
    let servers = shards(1);
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

    let mut body = pick(0xFEED);
    body["tenant"] = json!("team");
    body["max_tokens"] = json!(100);
    assert_eq!(post_json(&rt, &replicas[0].url("/v1/pick"), body).0, 200);
    wait_until("every replica to hold the pick", || replicas.iter().all(|r| count(r) == 1));
    assert!(used() > 0, "the pick reserved its tokens");

    // The proxy gave up on the pick and its cancel reached a replica that did not hold it
    // (here: a tombstone the replicas read when they resync): nobody forwarded the request,
    // so its reservation is given back, as a pick discarded on arrival gives it back.
    assert!(servers[0].inline("SET t:cxl:65261 65261 PX 60000").is_some_and(|r| r.starts_with("+OK")));
    assert!(servers[0].inline("CLIENT KILL TYPE pubsub").is_some_and(|r| r.starts_with(':')));
    wait_until("the pick freed everywhere", || replicas.iter().all(|r| count(r) == 0));
    wait_until("the reservation given back", || used() == 0);
}
