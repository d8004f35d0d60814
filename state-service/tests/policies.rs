//! Policies through the whole pick path (state + index + load), without HTTP.

mod common;

use kvroute_core::wire::PickRequest;
use kvroute_state::load::VllmLoad;
use kvroute_state::pick::pick;
use kvroute_state::score::Policy;
use kvroute_state::types::EngineSlot;
use std::collections::BTreeSet;
use tokio::time::Instant;

fn req(keys: std::ops::Range<u64>) -> PickRequest {
    let n = (keys.end - keys.start) as u32;
    PickRequest { model: "m".into(), token_keys: keys.collect(), block_size: 16, prompt_tokens: n * 16, ..Default::default() }
}

fn set_load(state: &kvroute_state::state::AppState, id: &str, running: u32, waiting: u32) {
    let worker = state.registry.read().get(id).unwrap();
    worker.load.lock().record_ok(VllmLoad { running, waiting, ..VllmLoad::default() }, Instant::now());
}

#[tokio::test]
async fn cached_worker_wins_on_equal_queues_idle_worker_wins_behind_a_long_queue() {
    let (state, index) = common::state(&["a", "b"]);
    index.hold(EngineSlot(0), &(0..200).collect::<Vec<_>>());
    set_load(&state, "a", 4, 2);
    set_load(&state, "b", 4, 2);
    let warm = pick(&state, &req(0..250));
    assert_eq!((warm.worker_id.as_str(), warm.matched_blocks), ("a", 200));
    state.reset();
    // 40 waiting requests of ~512 tokens ahead on a: far more than the 3200 tokens saved.
    set_load(&state, "a", 8, 40);
    let cold = pick(&state, &req(0..250));
    assert_eq!((cold.worker_id.as_str(), cold.matched_blocks), ("b", 0));
}

#[tokio::test]
async fn baselines_ignore_the_index() {
    let (state, index) = common::state(&["a", "b", "c"]);
    index.hold(EngineSlot(2), &[0, 1, 2, 3]);

    *state.policy.write() = Policy::RoundRobin;
    let order: Vec<String> = (0..6).map(|_| pick(&state, &req(0..4)).worker_id).collect();
    assert_eq!(order, ["a", "b", "c", "a", "b", "c"]);

    state.reset();
    *state.policy.write() = Policy::LeastLoaded;
    set_load(&state, "a", 5, 0);
    set_load(&state, "c", 9, 9);
    assert_eq!(pick(&state, &req(0..4)).worker_id, "b");

    state.reset();
    *state.policy.write() = Policy::Random;
    let seen: BTreeSet<String> = (0..60).map(|_| pick(&state, &req(0..4)).worker_id).collect();
    assert_eq!(seen.len(), 3);

    // approx_prefix: the first pick of a prefix goes to the least loaded (b), not to c which
    // holds it per the KV index; the next ones follow what it learned.
    state.reset();
    *state.policy.write() = Policy::ApproxPrefix;
    let first = pick(&state, &req(0..4));
    assert_eq!((first.worker_id.as_str(), first.matched_blocks), ("b", 0), "matched_blocks is what b holds per the index");
    for _ in 0..3 {
        assert_eq!(pick(&state, &req(0..4)).worker_id, "b");
    }
}
