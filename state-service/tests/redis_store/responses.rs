//! Responses API affinity across replicas: the worker that stored a response, learned by the
//! replica that got its report, is found by another replica (and by one started afterwards)
//! through Redis, so a follow-up or a GET may enter through any of them.

use super::support::*;
use serde_json::json;

#[test]
fn a_stored_response_is_found_through_any_replica() {
    let servers = shards(2);
    let config = |name: &str, seed: u64| {
        let mut c = redis_config(&servers, name, seed);
        plain_workers(&mut c, 3);
        c.responses.store_timeout_ms = 500;
        c
    };
    let a = Replica::start(config("a", 1));
    let b = Replica::start(config("b", 2));
    let rt = client_rt();
    let (status, first) = post_json(&rt, &a.url("/v1/pick"), json!({ "model": "m", "token_keys": [1, 2], "block_size": 16, "prompt_tokens": 32 }));
    assert_eq!(status, 200);
    let (owner, id) = (first["worker_id"].as_str().unwrap().to_string(), first["assignment_id"].as_u64().unwrap());
    let report = json!({ "reports": [
        { "assignment_id": id, "kind": 1, "elapsed_ms": 4.0, "response_id": "resp_shared" },
        { "assignment_id": id, "kind": 2, "prompt_tokens": 32, "completion_tokens": 8, "response_id": "resp_shared" } ] });
    assert_eq!(post_json(&rt, &a.url("/v1/report"), report).0, 204);

    // Through the other replica: its pick and its locate find the owner in Redis.
    let follow = json!({ "model": "m", "token_keys": [9], "block_size": 16, "prompt_tokens": 16, "previous_response_id": "resp_shared" });
    let mut found = String::new();
    wait_until("the owner reached Redis", || {
        let (_, located) = post_json(&rt, &b.url("/v1/locate"), json!({ "response_id": "resp_shared" }));
        found = located["worker_id"].as_str().unwrap_or_default().to_string();
        !found.is_empty()
    });
    assert_eq!(found, owner);
    for _ in 0..3 {
        let (_, p) = post_json(&rt, &b.url("/v1/pick"), follow.clone());
        assert_eq!(p["worker_id"], owner.as_str(), "every follow-up through b goes to the owner");
    }
    // A replica started now (or restarted) knows it too.
    drop(b);
    let c = Replica::start(config("c", 3));
    let (_, p) = post_json(&rt, &c.url("/v1/pick"), follow);
    assert_eq!(p["worker_id"], owner.as_str());
    let (_, unknown) = post_json(&rt, &c.url("/v1/locate"), json!({ "response_id": "resp_nobody" }));
    assert_eq!((unknown["worker_id"].as_str(), unknown["degraded_reason"].as_str()), (Some(""), Some("")));
}
