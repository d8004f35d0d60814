//! Two replicas on three Redis shards act as one instance: a burst sharing a new prefix,
//! split across both, spreads over the workers exactly as a single instance spreads it, and
//! a conversation's next turn lands on the worker holding its prefix whichever replica it
//! enters. Driven over each replica's HTTP `/v1/pick`.

use super::support::*;
use kvroute_state::assign::AssignmentId;
use kvroute_state::config::Config;
use kvroute_state::app::App;
use kvroute_core::wire::PickRequest;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;

const WORKERS: usize = 4;
const BURST: usize = 24;

fn keys(conversation: u64, blocks: u64) -> Vec<u64> {
    (0..blocks).map(|b| conversation << 32 | b).collect()
}

fn pick_body(keys: &[u64]) -> serde_json::Value {
    json!({ "model": "m", "token_keys": keys, "block_size": 16, "prompt_tokens": keys.len() * 16 })
}

fn sorted_counts(workers: &[String]) -> Vec<usize> {
    let mut by: BTreeMap<&str, usize> = BTreeMap::new();
    for w in workers {
        *by.entry(w).or_default() += 1;
    }
    let mut v: Vec<usize> = by.into_values().collect();
    v.sort_unstable_by(|a, b| b.cmp(a));
    v
}

fn seen(state: &App, id: u64) -> bool {
    state.fleet.assignments().contains(AssignmentId(id))
}

/// Burst request `i`: a 64-block prefix all share, then 64 blocks of its own (a long shared
/// system prompt, different questions): each one queued on the prefix's worker adds prefill
/// work there, so the burst spreads once that queue costs more than the prefix saves.
fn burst_keys(i: usize) -> Vec<u64> {
    let mut k = keys(7, 64);
    k.extend((64..128).map(|b| (1000 + i as u64) << 32 | b));
    k
}

#[test]
fn burst_spreads_like_one_instance_and_follow_ups_stick() {
    // The single-instance answer: memory store, same workers, same burst.
    let mut single = Config { seed: Some(1), ..Config::default() };
    single.timeouts.speculative_ttl_ms = 60_000;
    plain_workers(&mut single, WORKERS);
    let one = App::new(single, Arc::new(kvroute_kv::index::memory::MemoryIndex::new())).expect("config");
    let req = |i| PickRequest { model: "m".into(), token_keys: burst_keys(i), block_size: 16, prompt_tokens: 2048, ..Default::default() };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let expected: Vec<String> =
        (0..BURST).map(|i| rt.block_on(one.picker.pick(&req(i), kvroute_state::pick::Deadline::default())).worker_id).collect();
    assert!(sorted_counts(&expected).len() > 1, "the burst must spread at all: {expected:?}");

    let servers = shards(3);
    let replicas: Vec<Replica> = (0..2)
        .map(|i| {
            let mut c = redis_config(&servers, &format!("r{i}"), 1);
            plain_workers(&mut c, WORKERS);
            Replica::start(c)
        })
        .collect();
    let rt = client_rt();
    let mut got = Vec::new();
    for i in 0..BURST {
        let (status, resp) = post_json(&rt, &replicas[i % 2].url("/v1/pick"), pick_body(&burst_keys(i)));
        assert_eq!(status, 200, "{resp}");
        assert_eq!(resp["degraded_reason"], "", "all shards up: {resp}");
        let id = resp["assignment_id"].as_u64().expect("id");
        got.push(resp["worker_id"].as_str().expect("worker").to_string());
        // A burst as fast as replication: the next pick waits for the other replica to
        // know this one (observable: its table holds the assignment).
        wait_until("the pick to replicate", || replicas.iter().all(|r| seen(&r.state, id)));
    }
    assert_eq!(sorted_counts(&got), sorted_counts(&expected), "two replicas {got:?} vs one instance {expected:?}");
    for r in &replicas {
        assert_eq!(r.state.fleet.assignments().len(), BURST, "each replica accounts for the whole burst");
    }

    // Reports on either replica free the burst's assignments on both.
    let ids: Vec<u64> = replicas[0].state.fleet.assignments().iter().map(|a| a.id.0).collect();
    let reports: Vec<_> = ids.iter().map(|id| json!({ "assignment_id": id, "kind": 3 })).collect();
    let (status, _) = post_json(&rt, &replicas[1].url("/v1/report"), json!({ "reports": reports }));
    assert_eq!(status, 204);
    wait_until("frees to replicate", || replicas.iter().all(|r| r.state.fleet.assignments().is_empty()));

    // Conversations: turn 1 on one replica (completed there), turn 2 (same prefix, longer)
    // on the other.
    for conv in 100..108u64 {
        let (a, b) = ((conv % 2) as usize, 1 - (conv % 2) as usize);
        let (_, t1) = post_json(&rt, &replicas[a].url("/v1/pick"), pick_body(&keys(conv, 48)));
        let id = t1["assignment_id"].as_u64().expect("id");
        // Replicated before it completes: otherwise both tables are empty before the other
        // replica has heard of turn 1, and turn 2 would race the pub/sub hop.
        wait_until("turn 1 to replicate", || replicas.iter().all(|r| seen(&r.state, id)));
        let (status, _) = post_json(&rt, &replicas[a].url("/v1/report"), json!({ "reports": [{ "assignment_id": id, "kind": 3 }] }));
        assert_eq!(status, 204);
        wait_until("turn 1 to complete everywhere", || replicas.iter().all(|r| r.state.fleet.assignments().is_empty()));
        let (_, t2) = post_json(&rt, &replicas[b].url("/v1/pick"), pick_body(&keys(conv, 56)));
        assert_eq!(t2["worker_id"], t1["worker_id"], "conversation {conv}: turn 2 {t2} vs turn 1 {t1}");
        assert_eq!(t2["matched_blocks"], 48, "conversation {conv}: turn 2 {t2} vs turn 1 {t1}");
        let id = t2["assignment_id"].as_u64().expect("id");
        post_json(&rt, &replicas[b].url("/v1/report"), json!({ "reports": [{ "assignment_id": id, "kind": 3 }] }));
        wait_until("turn 2 to complete everywhere", || replicas.iter().all(|r| r.state.fleet.assignments().is_empty()));
    }
}
