//! Workers registered and removed at runtime through one replica's admin API reach every
//! replica, and a replica that starts later registers the stored ones (from Redis) as if
//! they were in its config.

use super::support::*;
use serde_json::json;

const TOKEN: &str = "admin-secret";

fn admin(rt: &tokio::runtime::Runtime, method: reqwest::Method, url: String, body: Option<serde_json::Value>) -> u16 {
    rt.block_on(async {
        let mut req = reqwest::Client::new().request(method, url).bearer_auth(TOKEN);
        if let Some(b) = body {
            req = req.json(&b);
        }
        req.send().await.expect("request sent").status().as_u16()
    })
}

fn has(r: &Replica, id: &str) -> bool {
    r.state.fleet.worker(id).is_some()
}

#[test]
fn admin_registered_workers_are_shared_by_every_replica() {
    let mut servers = shards(3);
    let config = |name: &str, seed| {
        let mut c = redis_config(&servers, name, seed);
        c.admin_token = Some(TOKEN.into());
        plain_workers(&mut c, 1);
        c
    };
    let (a, b) = (Replica::start(config("ra", 1)), Replica::start(config("rb", 2)));
    let rt = client_rt();
    let worker = json!({ "id": "w9", "model": "other", "endpoint": "127.0.0.1:8999", "cluster": "c9" });
    assert_eq!(admin(&rt, reqwest::Method::POST, a.url("/admin/workers"), Some(worker)), 201);
    wait_until("replica b to register w9", || has(&b, "w9"));

    // Picks for the worker's model on the other replica go to it.
    let (status, resp) = post_json(&rt, &b.url("/v1/pick"), json!({ "model": "other", "token_keys": [1, 2], "block_size": 16, "prompt_tokens": 32 }));
    assert_eq!((status, resp["worker_id"].as_str(), resp["cluster"].as_str()), (200, Some("w9"), Some("c9")), "{resp}");

    // A replica started now registers it at start, before any event.
    let c = Replica::start(config("rc", 3));
    assert!(has(&c, "w9"), "stored workers are registered on start");
    assert!(has(&c, "w0"), "its own config still applies");

    // Removed through b: gone everywhere, and a later replica does not see it. The pick above
    // is still in flight (never reported), so a plain DELETE would drain first (202).
    assert_eq!(admin(&rt, reqwest::Method::DELETE, b.url("/admin/workers/w9"), None), 202);
    assert_eq!(admin(&rt, reqwest::Method::DELETE, b.url("/admin/workers/w9?force=true"), None), 204);
    wait_until("replicas a and c to remove w9", || !has(&a, "w9") && !has(&c, "w9"));
    let d = Replica::start(config("rd", 4));
    assert!(!has(&d, "w9"));
    // Config workers are each replica's own: removing one removes it from that replica only,
    // and a runtime registration cannot take over a configured id.
    assert_eq!(admin(&rt, reqwest::Method::DELETE, d.url("/admin/workers/w0"), None), 204);
    assert_eq!(admin(&rt, reqwest::Method::POST, a.url("/admin/workers"), Some(json!({ "id": "w0", "model": "m" }))), 409);
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(!has(&d, "w0") && [&a, &b, &c].iter().all(|r| has(r, "w0")));

    // First registration wins: an id already stored (here by hand, as by a replica whose
    // event has not arrived yet) is refused.
    let store = &a.store;
    let key = "t:worker:w12";
    let owner = store.shards.owner(key);
    let stored = json!({ "id": "w12", "model": "other" }).to_string();
    let _: () = rt.block_on(store.shards.cmd(owner, redis::cmd("SET").arg(key).arg(&stored))).expect("SET");
    assert_eq!(admin(&rt, reqwest::Method::POST, a.url("/admin/workers"), Some(json!({ "id": "w12", "model": "other", "endpoint": "x:1" }))), 409);
    let _: () = rt.block_on(store.shards.cmd(owner, redis::cmd("DEL").arg(key))).expect("DEL");

    // A worker this replica rejects (model m's workers use block size 16) is taken back from
    // Redis, so no other replica adopts it.
    let odd = json!({ "id": "w13", "model": "m", "endpoint": "127.0.0.1:8997", "block_size": 32 });
    assert_eq!(admin(&rt, reqwest::Method::POST, a.url("/admin/workers"), Some(odd)), 400);
    let w13: Option<String> = rt.block_on(store.shards.cmd(store.shards.owner("t:worker:w13"), redis::cmd("GET").arg("t:worker:w13"))).expect("GET");
    assert_eq!(w13, None);
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!([&a, &b, &c, &d].iter().all(|r| !has(r, "w13")));

    // Without Redis a registration is refused (503) and changes nothing, rather than living
    // on one replica only.
    for s in &mut servers {
        s.stop();
    }
    let late = json!({ "id": "w10", "model": "other", "endpoint": "127.0.0.1:8998" });
    assert_eq!(admin(&rt, reqwest::Method::POST, a.url("/admin/workers"), Some(late)), 503);
    assert!(!has(&a, "w10"));
}
