//! Assignment records older than their TTL are not adopted and not given a new life: records
//! written by hand into the shards (one past its first-token TTL, one from 1970) are skipped
//! by a starting replica's resync and by its subscriber (a stale `assigned` event), counted
//! as stale, and left in Redis exactly as they were; a live one is adopted, and its
//! first-token refresh gets only what is left of its assignment TTL.

use super::support::*;
use kvroute_state::assign::AssignmentId;
use kvroute_score::Policy;
use kvroute_state::store::redis::shards::Shards;
use kvroute_state::store::redis::wire::{unix_ms, Event, Message, Record};
use serde_json::json;
use std::sync::atomic::Ordering;
use std::time::Duration;

const FIRST_TOKEN_TTL_MS: u64 = 5_000;
const ASSIGNMENT_TTL_MS: u64 = 8_000;
/// What the stale records are stored with: far longer than they have left.
const STORED_PX: u64 = 60_000;

fn record(id: u64, age_ms: u64, first_token: bool) -> Record {
    Record {
        id,
        replica: "elsewhere".into(),
        worker: "w0".into(),
        policy: Policy::Kvroute,
        prompt_tokens: 32,
        uncached_tokens: 32,
        predicted_ttft_ms: 1.0,
        features: [1.0, 32.0, 0.0],
        keys: vec![],
        created_unix_ms: unix_ms().saturating_sub(age_ms),
        first_token,
        budget: None,
        reserved: 0,
        background: false,
    }
}

struct Direct {
    shards: Shards,
    conns: Vec<redis::Connection>,
    _rt: tokio::runtime::Runtime,
}

impl Direct {
    fn new(servers: &[RedisServer]) -> Direct {
        let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
        let rt = client_rt();
        let shards = {
            let _g = rt.enter();
            Shards::new(&urls, Duration::from_secs(1)).expect("shards")
        };
        let conns = urls.iter().map(|u| redis::Client::open(u.as_str()).and_then(|c| c.get_connection()).expect("connect")).collect();
        Direct { shards, conns, _rt: rt }
    }

    fn conn(&mut self, key: &str) -> &mut redis::Connection {
        let shard = self.shards.owner(key).0;
        &mut self.conns[shard]
    }

    fn put(&mut self, r: &Record, px: u64) -> String {
        let (key, json) = (format!("t:asg:{}", r.id), serde_json::to_string(r).expect("json"));
        let () = redis::cmd("SET").arg(&key).arg(&json).arg("PX").arg(px).query(self.conn(&key)).expect("SET");
        json
    }

    fn get(&mut self, id: u64) -> (Option<String>, i64) {
        let key = format!("t:asg:{id}");
        let value: Option<String> = redis::cmd("GET").arg(&key).query(self.conn(&key)).expect("GET");
        let pttl: i64 = redis::cmd("PTTL").arg(&key).query(self.conn(&key)).expect("PTTL");
        (value, pttl)
    }

    fn publish(&mut self, event: Event) {
        let msg = serde_json::to_string(&Message { from: "elsewhere".into(), event }).expect("json");
        let _: i64 = redis::cmd("PUBLISH").arg("t:events").arg(format!("elsewhere\n{msg}")).query(&mut self.conns[0]).expect("PUBLISH");
    }
}

#[test]
fn stale_records_are_neither_adopted_nor_rewritten() {
    let servers = shards(3);
    let mut direct = Direct::new(&servers);
    let waiting_too_long = record(1001, FIRST_TOKEN_TTL_MS + 1_000, false);
    let from_1970 = Record { created_unix_ms: 0, ..record(1002, 0, true) };
    let live = record(1003, 1_000, false);
    let stored = [direct.put(&waiting_too_long, STORED_PX), direct.put(&from_1970, STORED_PX)];
    direct.put(&live, FIRST_TOKEN_TTL_MS - 1_000);

    let mut c = redis_config(&servers, "fresh", 1);
    c.timeouts.first_token_ttl_ms = FIRST_TOKEN_TTL_MS;
    c.timeouts.assignment_ttl_ms = ASSIGNMENT_TTL_MS;
    plain_workers(&mut c, 1);
    let replica = Replica::start(c);
    let (stats, fleet) = (&replica.store.stats, &replica.state.fleet);
    wait_until("every shard resynced", || stats.resyncs.load(Ordering::Relaxed) >= 3);
    wait_until("the live record adopted", || fleet.assignments().contains(AssignmentId(1003)));
    assert!(!fleet.assignments().contains(AssignmentId(1001)), "past its first-token TTL: not adopted");
    assert!(!fleet.assignments().contains(AssignmentId(1002)), "from 1970: not adopted as brand new");
    assert!(stats.stale_records.load(Ordering::Relaxed) >= 2, "counted");

    // The subscriber: a stale `assigned` event, then a live one (same channel, in order).
    direct.publish(Event::Assigned(record(1004, FIRST_TOKEN_TTL_MS + 1, false)));
    direct.publish(Event::Assigned(record(1005, 10, false)));
    wait_until("the live event adopted", || fleet.assignments().contains(AssignmentId(1005)));
    assert!(!fleet.assignments().contains(AssignmentId(1004)), "stale event: not adopted");
    assert!(stats.stale_records.load(Ordering::Relaxed) >= 3, "counted");

    // Nothing rewrote the stale records: same value, their TTL only ran down.
    for (id, json) in [1001, 1002].into_iter().zip(&stored) {
        let (value, pttl) = direct.get(id);
        assert_eq!(value.as_ref(), Some(json), "record {id} untouched");
        assert!(pttl > 0 && pttl <= STORED_PX as i64, "record {id}: PTTL {pttl}");
    }

    // The live one's first token refreshes it to the end of its assignment TTL, no further.
    let rt = client_rt();
    let report = json!({ "reports": [{ "assignment_id": 1003, "kind": 1, "elapsed_ms": 5.0 }] });
    let (status, _) = post_json(&rt, &replica.url("/v1/report"), report);
    assert_eq!(status, 204);
    let mut refreshed = None;
    wait_until("the first-token refresh", || {
        let (value, pttl) = direct.get(1003);
        refreshed = value.and_then(|v| serde_json::from_str::<Record>(&v).ok()).filter(|r| r.first_token).map(|r| (r, pttl));
        refreshed.is_some()
    });
    let (r, pttl) = refreshed.expect("refreshed");
    let left = ASSIGNMENT_TTL_MS - 1_000;
    assert!(pttl > 0 && pttl <= left as i64, "TTL {pttl} ms, at most the {left} ms it had left");
    assert!(r.created_unix_ms.abs_diff(live.created_unix_ms) <= 5, "its age kept: {} vs {}", r.created_unix_ms, live.created_unix_ms);
}
