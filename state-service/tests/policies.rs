//! Policies through the whole pick path: the real state, the real `MemoryIndex` fed with
//! vLLM-shaped `BlockStored` events, scraped load, and the pick itself (no HTTP).

mod common;

use kvroute_core::keys::{token_block_keys, KeyRoot};
use kvroute_core::wire::PickRequest;
use kvroute_state::config::WorkerConfig;
use kvroute_kv::index::memory::MemoryIndex;
use kvroute_kv::index::KvIndex;
use kvroute_state::load::VllmLoad;
use kvroute_core::wire::PickResponse;
use kvroute_state::pick::Deadline;
use kvroute_score::Policy;
use kvroute_state::app::App;
use kvroute_kv::types::{EngineHash, EngineSlot, KvEvent, Tier};
use kvroute_state::tenancy::ledger::{LedgerFuture, Reserve, Settle};
use kvroute_state::tenancy::{Ledger, Limits, Outcome, Scope, Usage};
use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::Arc;
use tokio::time::Instant;

const BS: u32 = 16;

fn tokens(r: Range<u32>) -> Vec<u32> {
    r.map(|t| t * 7 + 1).collect()
}

/// The state on a real index with `workers` (engine slots 0, 1, ... in order).
fn state(workers: Vec<WorkerConfig>) -> (App, Arc<MemoryIndex>) {
    state_with(workers, |_| {})
}

/// [`state`] with its configuration edited.
fn state_with(workers: Vec<WorkerConfig>, edit: impl FnOnce(&mut kvroute_state::config::Config)) -> (App, Arc<MemoryIndex>) {
    let index = Arc::new(MemoryIndex::new());
    let mut config = common::config(&[]);
    config.workers = workers;
    edit(&mut config);
    (App::new(config, index.clone()).expect("valid config"), index)
}

fn worker(id: &str) -> WorkerConfig {
    WorkerConfig { endpoint: format!("127.0.0.1:{}", 8000 + id.len()), ..WorkerConfig::new(id, "m") }
}

/// Engine `slot` stores the blocks of `tokens` as vLLM reports them (one chain, in one event).
fn store(index: &MemoryIndex, slot: u32, tokens: &[u32], lora_name: Option<&str>) {
    store_in(index, slot, tokens, lora_name, Tier::Gpu);
}

fn store_in(index: &MemoryIndex, slot: u32, tokens: &[u32], lora_name: Option<&str>, tier: Tier) {
    let blocks = tokens.len() as u64 / u64::from(BS);
    let hashes = (0..blocks).map(|b| EngineHash(u64::from(slot) << 32 | b)).collect();
    let event = KvEvent::Stored {
        hashes,
        parent: None,
        token_ids: tokens.to_vec(),
        block_size: BS,
        lora_name: lora_name.map(str::to_string),
        cache_salt: None,
        tier,
    };
    let applied = index.apply(EngineSlot(slot), "m", BS, &[event]);
    assert_eq!(applied.blocks_stored, blocks);
}

/// What the filter sends for a token-id prompt addressed to `model`.
fn req(model: &str, tokens: &[u32]) -> PickRequest {
    let keys = token_block_keys(&KeyRoot::new(model, ""), tokens, BS as usize);
    PickRequest {
        model: model.into(),
        token_keys: keys.iter().map(|k| k.0).collect(),
        block_size: BS,
        prompt_tokens: tokens.len() as u32,
        ..Default::default()
    }
}

async fn pick(state: &App, req: &PickRequest) -> PickResponse {
    state.picker.pick(req, Deadline::default()).await
}

/// The workers of `n` picks of `req`, in order.
async fn picks(state: &App, req: &PickRequest, n: usize) -> Vec<String> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(pick(state, req).await.worker_id);
    }
    out
}

fn set_load(state: &App, id: &str, running: u32, waiting: u32) {
    let worker = state.fleet.worker(id).unwrap();
    worker.load.lock().record_ok(VllmLoad { running, waiting, ..VllmLoad::default() }, Instant::now());
}

#[tokio::test]
async fn cached_worker_wins_on_equal_queues_idle_worker_wins_behind_a_long_queue() {
    let (state, index) = state(vec![worker("a"), worker("b")]);
    let prompt = tokens(0..4000);
    store(&index, 0, &prompt[..3200], None);
    set_load(&state, "a", 4, 2);
    set_load(&state, "b", 4, 2);
    let warm = pick(&state, &req("m", &prompt)).await;
    assert_eq!((warm.worker_id.as_str(), warm.matched_blocks, warm.total_blocks), ("a", 200, 250));
    state.picker.reset();
    // 60 waiting requests of ~512 tokens ahead on a: ~30k tokens of waiting against the
    // 3200 saved, more than the placement cost charges b's extra prefill to the queue there
    // (3200 tokens beyond a's 800, x 2 waiting x weight 2) and beyond the affinity tolerance.
    // (At 40 waiting, ~21k tokens, the cached worker still keeps the prompt.)
    set_load(&state, "a", 8, 60);
    let cold = pick(&state, &req("m", &prompt)).await;
    assert_eq!((cold.worker_id.as_str(), cold.matched_blocks), ("b", 0));
}

#[tokio::test]
async fn baselines_ignore_the_index() {
    let (state, index) = state(vec![worker("a"), worker("b"), worker("c")]);
    let prompt = tokens(0..64);
    store(&index, 2, &prompt, None);

    state.picker.set_policy(Policy::RoundRobin);
    let order = picks(&state, &req("m", &prompt), 6).await;
    assert_eq!(order, ["a", "b", "c", "a", "b", "c"]);

    state.picker.reset();
    state.picker.set_policy(Policy::LeastLoaded);
    set_load(&state, "a", 5, 0);
    set_load(&state, "c", 9, 9);
    assert_eq!(pick(&state, &req("m", &prompt)).await.worker_id, "b");

    state.picker.reset();
    state.picker.set_policy(Policy::Random);
    let seen: BTreeSet<String> = picks(&state, &req("m", &prompt), 60).await.into_iter().collect();
    assert_eq!(seen.len(), 3);

    // SGLang: the first pick of a prefix goes to the least loaded by its own count (all idle:
    // the first, a), not to c which holds it per the KV index; the next ones follow its tree.
    state.picker.reset();
    state.picker.set_policy(Policy::SglangCacheAware);
    let first = pick(&state, &req("m", &prompt)).await;
    assert_eq!((first.worker_id.as_str(), first.matched_blocks), ("a", 0), "matched_blocks is what a holds per the index");
    for _ in 0..3 {
        assert_eq!(pick(&state, &req("m", &prompt)).await.worker_id, "a");
    }

    // kvroute reads the index: c holds all of it (and is as idle as the others now).
    state.picker.reset();
    state.picker.set_policy(Policy::Kvroute);
    for id in ["a", "b", "c"] {
        set_load(&state, id, 0, 0);
    }
    let exact = pick(&state, &req("m", &prompt)).await;
    assert_eq!((exact.worker_id.as_str(), exact.matched_blocks), ("c", 4));
}

/// vLLM's convention: a request names a LoRA adapter in `model`; its blocks are stored with
/// that `lora_name`. Only the workers serving the adapter are candidates, and its blocks
/// match only requests for the adapter.
#[tokio::test]
async fn a_lora_request_matches_blocks_stored_with_its_lora_name() {
    let with_adapter = WorkerConfig { lora_adapters: vec!["sql-lora".into()], ..worker("ad") };
    let (state, index) = state(vec![worker("base"), with_adapter.clone(), WorkerConfig { id: "ad2".into(), ..with_adapter }]);
    let prompt = tokens(0..320);
    store(&index, 1, &prompt, Some("sql-lora"));
    store(&index, 0, &prompt, None);

    let lora = pick(&state, &req("sql-lora", &prompt)).await;
    assert_eq!((lora.worker_id.as_str(), lora.matched_blocks, lora.total_blocks), ("ad", 20, 20), "{lora:?}");
    let seen: BTreeSet<String> = picks(&state, &req("sql-lora", &tokens(5000..5100)), 20).await.into_iter().collect();
    assert!(!seen.contains("base"), "only adapter workers serve the adapter: {seen:?}");

    // The base model's blocks are not the adapter's, and the other way round.
    let base = pick(&state, &req("m", &prompt)).await;
    assert_eq!((base.worker_id.as_str(), base.matched_blocks), ("base", 20));
    let unknown = pick(&state, &req("other-lora", &prompt)).await;
    assert_eq!(unknown.degraded_reason().label(), "unknown_model");
}

/// vLLM's offloading connector reports blocks it moved to CPU memory with `medium` "CPU": a
/// worker holding the prefix only there reloads it (cheap) instead of recomputing it, and a
/// GPU hit is cheaper still.
#[tokio::test]
async fn a_cpu_tier_hit_is_predicted_between_a_gpu_hit_and_a_recompute() {
    let (state, index) = state(vec![worker("gpu"), worker("cpu"), worker("none")]);
    let prompt = tokens(0..8000);
    store_in(&index, 0, &prompt[..6400], None, Tier::Gpu);
    // Offloaded, then evicted from the GPU: only the CPU copy is left.
    store_in(&index, 1, &prompt[..6400], None, Tier::Gpu);
    store_in(&index, 1, &prompt[..6400], None, Tier::Cpu);
    let hashes = (0..400u64).map(|b| EngineHash(1u64 << 32 | b)).collect();
    index.apply(EngineSlot(1), "m", BS, &[KvEvent::Removed { hashes, tier: Tier::Gpu }]);
    for id in ["gpu", "cpu", "none"] {
        set_load(&state, id, 0, 0);
    }
    let first = pick(&state, &req("m", &prompt)).await;
    assert_eq!((first.worker_id.as_str(), first.matched_blocks), ("gpu", 400));
    // With the GPU worker gone, the CPU copy still beats recomputing.
    state.membership.remove_worker("gpu");
    let second = pick(&state, &req("m", &prompt)).await;
    assert_eq!((second.worker_id.as_str(), second.matched_blocks), ("cpu", 400), "{second:?}");
    let (gpu_ms, cpu_ms) = (first.predicted_ttft_ms, second.predicted_ttft_ms);
    // Same 1600 tokens to prefill; the CPU hit adds 6400 tokens of reload at 0.01 ms.
    assert!((cpu_ms - gpu_ms - 64.0).abs() < 1.0, "gpu {gpu_ms} cpu {cpu_ms}");
}

/// Parks `n` assignments on `id` (router-counted load, as SGLang's router counts it).
fn park(state: &App, id: &str, n: u64) {
    use kvroute_state::assign::{Assignment, AssignmentId};
    for i in 0..n {
        let assignment = Assignment {
            id: AssignmentId(0xABC0_0000 + i + n * 1000),
            worker: kvroute_kv::types::WorkerId::new(id),
            policy: Policy::SglangCacheAware,
            prompt_tokens: 16,
            uncached_tokens: 16,
            predicted_ttft_ms: 1.0,
            features: Default::default(),
            created_at: Instant::now(),
            first_token_at: None,
            predicted_cached_tokens: None,
            budget: None,
            reserved: 0,
            background: false,
        };
        state.fleet.assign(&assignment, &Arc::from([]), Instant::now());
    }
}

#[tokio::test]
async fn sglang_follows_its_tree_until_the_router_load_is_imbalanced() {
    let (state, _) = state(vec![worker("a"), worker("b")]);
    state.picker.set_policy(Policy::SglangCacheAware);
    let prompt = tokens(0..320);
    // Nothing learned: least router load, first on ties.
    assert_eq!(pick(&state, &req("m", &prompt)).await.worker_id, "a");
    // Learned: the whole prompt matches a (rate 1 > 0.3), even once a is busier.
    park(&state, "a", 30);
    assert_eq!(pick(&state, &req("m", &prompt)).await.worker_id, "a");
    // 70 more on a than on b (> 64, and > 1.5x): imbalanced, shortest queue.
    park(&state, "a", 40);
    assert_eq!(pick(&state, &req("m", &prompt)).await.worker_id, "b");
}

#[tokio::test]
async fn llmd_weighs_its_prefix_memory_against_queue_and_kv_usage() {
    let (state, _) = state(vec![worker("a"), worker("b")]);
    state.picker.set_policy(Policy::LlmdDefault);
    let prompt = tokens(0..320);
    let first = pick(&state, &req("m", &prompt)).await.worker_id;
    // Prefix 3 + queue 2 + kv 2 beats 2 + 2.
    for _ in 0..3 {
        assert_eq!(pick(&state, &req("m", &prompt)).await.worker_id, first);
    }
    // A long queue and a full cache there: 3 + 0 + 0.2 loses to the other's 2 + 2.
    let worker = state.fleet.worker(&first).unwrap();
    worker.load.lock().record_ok(VllmLoad { waiting: 10, kv_usage: 0.9, ..VllmLoad::default() }, Instant::now());
    assert_ne!(pick(&state, &req("m", &prompt)).await.worker_id, first);
}

#[tokio::test]
async fn dynamo_reads_the_kv_index_and_the_in_flight_prefill() {
    let (state, index) = state(vec![worker("a"), worker("b")]);
    state.picker.set_policy(Policy::DynamoKv);
    let prompt = tokens(0..3200);
    store(&index, 1, &prompt, None);
    // b holds all 200 blocks: prefill 0 + decode 0 vs a: 200 + 200.
    assert_eq!(pick(&state, &req("m", &prompt)).await.worker_id, "b");
    // Its tokens were all cached: no prefill in flight on b, and b again.
    assert_eq!(pick(&state, &req("m", &prompt)).await.worker_id, "b");
    // A cold prompt goes where fewer blocks are active (b's two requests hold 200).
    assert_eq!(pick(&state, &req("m", &tokens(9000..9320))).await.worker_id, "a");
}

/// With `[scheduling]` on, a pick whose best worker is saturated waits in the router for it
/// rather than going cold to the idle one (or joining the engine's queue at once), while a
/// pick that is best on the idle worker goes there at once, past it; the waiting pick is bound
/// when its worker has room, to that worker, with its prefix.
#[tokio::test]
async fn a_queued_pick_waits_for_the_worker_it_is_best_on_and_others_pass_it() {
    let engine_queue = |c: &mut kvroute_state::config::Config| {
        c.scheduling.enabled = true;
        c.scheduling.max_engine_waiting = 1;
    };
    let (state, index) = state_with(vec![worker("a"), worker("b")], engine_queue);
    let warm = tokens(0..8200);
    store(&index, 0, &warm[..8000], None);
    // a's engine queues a request (saturated at max_engine_waiting 1); b is idle.
    set_load(&state, "a", 4, 1);
    set_load(&state, "b", 0, 0);
    // The proxy names each pick (its ticket in the queue).
    let named = |id: u64, tokens: &[u32]| PickRequest { assignment_id: id, ..req("m", tokens) };
    let kvroute_state::pick::Picked::Queued(warm_wait) = state.picker.pick_or_queue(&named(1, &warm), Deadline::default()).await else {
        panic!("the warm pick's best worker, a, is saturated: it waits");
    };
    // A cold prompt is best on idle b: queued behind the warm one, it is placed by the next
    // pass, which leaves the warm one waiting.
    let cold = named(2, &tokens(100_000..102_000));
    let kvroute_state::pick::Picked::Queued(cold_wait) = state.picker.pick_or_queue(&cold, Deadline::default()).await else {
        panic!("picks of the model wait, so a new one takes its turn");
    };
    state.picker.dispatch_once().await;
    let cold = cold_wait.decision().await;
    assert_eq!((cold.worker_id.as_str(), cold.matched_blocks), ("b", 0));
    // b now has an unstarted pick, a still its engine queue: the warm pick still waits.
    state.picker.dispatch_once().await;
    set_load(&state, "a", 5, 0);
    state.picker.dispatch_once().await;
    let warm = warm_wait.decision().await;
    assert_eq!((warm.worker_id.as_str(), warm.matched_blocks), ("a", 500), "bound to a once it has room, with its prefix");

    // The peers' rule (llm-d's flow control, Dynamo's router queue): nothing waits while any
    // worker has room, so the warm pick joins a's engine queue at once.
    let all = |c: &mut kvroute_state::config::Config| {
        engine_queue(c);
        c.scheduling.wait_when = kvroute_state::sched::WaitWhen::AllSaturated;
    };
    let (state, index) = state_with(vec![worker("a"), worker("b")], all);
    let warm = tokens(0..8200);
    store(&index, 0, &warm[..8000], None);
    set_load(&state, "a", 4, 1);
    set_load(&state, "b", 0, 0);
    let kvroute_state::pick::Picked::Decided(now) = state.picker.pick_or_queue(&named(3, &warm), Deadline::default()).await else {
        panic!("b has room: nothing waits");
    };
    assert_eq!(now.worker_id, "a");
}

/// A ledger whose reservations wait for the test's word (a budget store that answers slowly):
/// a dispatcher pass is caught between taking a pick out of the queue and deciding it.
struct GatedLedger {
    inner: Arc<kvroute_state::tenancy::window::MemoryLedger>,
    gate: Arc<Gate>,
}

struct Gate {
    entered: tokio::sync::Notify,
    open: tokio::sync::Semaphore,
    reserves: std::sync::atomic::AtomicUsize,
}

impl Ledger for GatedLedger {
    fn reserve(&self, r: Reserve) -> LedgerFuture<Outcome> {
        self.gate.reserves.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.gate.entered.notify_one();
        let (gate, inner) = (self.gate.clone(), self.inner.clone());
        Box::pin(async move {
            gate.open.acquire().await.expect("open").forget();
            inner.reserve(r).await
        })
    }
    fn settle(&self, s: Settle) -> LedgerFuture<()> {
        self.inner.settle(s)
    }
    fn usage(&self, scope: Scope, window_ms: u64) -> LedgerFuture<Usage> {
        self.inner.usage(scope, window_ms)
    }
    fn set_limits(&self, scope: Scope, limits: Option<Limits>) -> LedgerFuture<()> {
        self.inner.set_limits(scope, limits)
    }
    fn limits_override(&self, scope: Scope) -> LedgerFuture<Option<Limits>> {
        self.inner.limits_override(scope)
    }
    fn overrides(&self) -> LedgerFuture<Vec<(Scope, Limits)>> {
        self.inner.overrides()
    }
}

/// The proxy's next call for a queued pick can come while a dispatcher pass has it out of the
/// queue and is admitting it (its budget store answering slowly): that call waits for the
/// pass's decision. It must not queue the pick anew, which would admit and place it twice.
#[tokio::test]
async fn a_call_for_a_pick_a_dispatcher_pass_has_out_waits_for_that_decision() {
    use kvroute_state::pick::Picked;
    let gate = Arc::new(Gate { entered: Default::default(), open: tokio::sync::Semaphore::new(0), reserves: Default::default() });
    let ledger = Arc::new(GatedLedger { inner: kvroute_state::tenancy::window::MemoryLedger::new(), gate: gate.clone() });
    let mut config = common::config(&[]);
    config.workers = vec![worker("a")];
    config.scheduling.enabled = true;
    config.scheduling.max_engine_waiting = 1;
    config.tenancy.store_timeout_ms = 30_000;
    config.tenancy.budgets.insert("t".into(), kvroute_state::tenancy::Budget { tokens_per_minute: Some(10_000_000), ..Default::default() });
    let mut store = kvroute_state::store::memory::MemoryStore::store(Arc::new(MemoryIndex::new()));
    store.ledger = Some(ledger.clone() as Arc<dyn Ledger>);
    let state = App::build(config, store).expect("valid config");
    set_load(&state, "a", 4, 1);
    let first = PickRequest { tenant: "t".into(), assignment_id: 1, ..req("m", &tokens(0..2_000)) };
    let Picked::Queued(call) = state.picker.pick_or_queue(&first, Deadline::default()).await else { panic!("a is saturated: the pick waits") };
    // That call ends before the pick is decided; the proxy will call again with its ticket.
    drop(call);
    set_load(&state, "a", 4, 0);
    let pass = tokio::spawn({
        let picker = state.picker.clone();
        async move { picker.dispatch_once().await }
    });
    tokio::time::timeout(std::time::Duration::from_secs(5), gate.entered.notified()).await.expect("the pass admits the pick");
    let again = tokio::spawn({
        let picker = state.picker.clone();
        let req = PickRequest { ticket: 1, ..first.clone() };
        async move { picker.pick(&req, Deadline::default()).await }
    });
    // Let the call run as far as it can before the budget store answers.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    gate.open.add_permits(8);
    pass.await.unwrap();
    let decided = tokio::time::timeout(std::time::Duration::from_secs(5), again).await.expect("the call gets the pass's decision").unwrap();
    assert_eq!((decided.worker_id.as_str(), decided.assignment_id), ("a", 1), "{decided:?}");
    state.picker.dispatch_once().await;
    assert_eq!(gate.reserves.load(std::sync::atomic::Ordering::SeqCst), 1, "admitted once");
    assert_eq!(state.fleet.in_flight(&kvroute_kv::types::WorkerId::new("a")), 1, "placed once");
}

// Runs in well under the picks' predicted first tokens (~1 s), which shields and the
// unstarted count read.
#[tokio::test]
async fn a_backlogged_tenant_leaves_a_worker_to_drain_for_a_tenant_under_its_share() {
    use kvroute_state::assign::AssignmentId;
    use kvroute_state::pick::{wait::Waiting, Picked};
    let headroom = |n: u32| {
        move |c: &mut kvroute_state::config::Config| {
            c.scheduling.enabled = true;
            c.scheduling.max_unstarted = 2;
            c.scheduling.headroom_workers = n;
        }
    };
    let of = |tenant: &str, id: u64| PickRequest { tenant: tenant.into(), assignment_id: id, ..req("m", &tokens(id as u32 * 100_000..id as u32 * 100_000 + 10_000)) };
    let within = |w: Waiting| async move { tokio::time::timeout(std::time::Duration::from_secs(5), w.decision()).await.expect("dispatched") };
    for reserve in [1, 0] {
        let (state, _) = state_with(vec![worker("a"), worker("b")], headroom(reserve));
        // First tokens are reported as the prior predicts them (~1 s), so that both workers
        // stay calibrated alike.
        // B places a pick, which starts: B is an active flow.
        let Picked::Decided(_) = state.picker.pick_or_queue(&of("b", 1), Deadline::default()).await else { panic!("an idle fleet") };
        state.fleet.first_token(AssignmentId(1), 1_000.0, Instant::now());
        // A fills both workers (two unstarted picks each saturate one), then queues more.
        let mut placed = Vec::new();
        let mut queued = Vec::new();
        for id in 2..8 {
            match state.picker.pick_or_queue(&of("a", id), Deadline::default()).await {
                Picked::Decided(r) => placed.push((id, r.worker_id)),
                Picked::Queued(w) => queued.push(w),
            }
        }
        assert_eq!((placed.len(), queued.len()), (4, 2), "two unstarted picks saturate a worker: {placed:?}");
        // One of A's picks starts: its worker has room again, and the fewest unstarted picks.
        let (started, roomy) = placed[0].clone();
        state.fleet.first_token(AssignmentId(started), 1_000.0, Instant::now());
        state.picker.dispatch_once().await;
        let next = queued.remove(0);
        if reserve == 0 {
            assert_eq!(within(next).await.worker_id, roomy, "without headroom the backlog refills the worker at once");
            continue;
        }
        let still = next.answer(Some(std::time::Instant::now() + std::time::Duration::from_millis(50))).await;
        assert!(still.queued.is_some(), "A has more queued and B is active: {roomy} is left to drain: {still:?}");
        // B's next pick takes its turn at once, on the worker kept from A's backlog.
        let Picked::Queued(b) = state.picker.pick_or_queue(&of("b", 9), Deadline::default()).await else { panic!("picks of the model wait, so B's takes its turn") };
        state.picker.dispatch_once().await;
        assert_eq!(within(b).await.worker_id, roomy);
        // A's other picks start: the other worker now has none unstarted and B's worker has
        // B's, but until B's predicted first token B's worker is the one kept from A, so that
        // no prefill of A's joins the step that prefills B's: A's backlog goes to the other.
        for (id, _) in &placed[1..] {
            state.fleet.first_token(AssignmentId(*id), 1_000.0, Instant::now());
        }
        state.picker.dispatch_once().await;
        // The first's call had ended (its decision waits for the proxy's next call).
        let Picked::Decided(first) = state.picker.pick_or_queue(&PickRequest { ticket: 6, ..of("a", 6) }, Deadline::default()).await else { panic!("the other worker has room") };
        assert!(!first.worker_id.is_empty() && first.worker_id != roomy, "{first:?}");
        // The last of A's queue is no longer over A's share: it goes where it is best.
        assert!(!within(queued.remove(0)).await.worker_id.is_empty());
    }
}

/// A proxy sends its reports on a tick (100 ms by default): a worker whose unstarted picks
/// are all past their predicted first token takes one more queued pick before the report
/// comes, so that the engine does not idle waiting for it; never more than one ahead.
#[tokio::test(start_paused = true)]
async fn a_worker_past_its_picks_predicted_first_token_takes_one_more_before_the_report() {
    use kvroute_state::assign::AssignmentId;
    use kvroute_state::pick::Picked;
    // Prefills of several engine steps (a pick that no worker holds goes a step ahead), with
    // each call held longer than the test waits (a queued pick whose proxy stops asking is dropped).
    let (state, _) = state_with(vec![worker("a")], |c| {
        c.scheduling.enabled = true;
        c.scheduling.wait_ms = 10_000;
    });
    let of = |id: u64| PickRequest { assignment_id: id, ..req("m", &tokens(id as u32 * 100_000..id as u32 * 100_000 + 20_000)) };
    let Picked::Decided(first) = state.picker.pick_or_queue(&of(1), Deadline::default()).await else { panic!("an idle worker") };
    let after_ttft = |r: &PickResponse| std::time::Duration::from_secs_f64(r.predicted_ttft_ms / 1000.0) + std::time::Duration::from_millis(1);
    let queue = |id: u64| {
        let state = &state;
        async move {
            match state.picker.pick_or_queue(&of(id), Deadline::default()).await {
                Picked::Queued(w) => w,
                Picked::Decided(r) => panic!("a's unstarted pick saturates it (max_unstarted 1): {r:?}"),
            }
        }
    };
    let (second, third) = (queue(2).await, queue(3).await);
    state.picker.dispatch_once().await;
    let short = || Some(std::time::Instant::now() + std::time::Duration::from_millis(5));
    tokio::time::advance(after_ttft(&first)).await;
    state.picker.dispatch_once().await;
    let second = tokio::time::timeout(std::time::Duration::from_secs(1), second.decision()).await.expect("dispatched before the report");
    assert_eq!(second.worker_id, "a", "the first is past its predicted first token: the next goes before its report: {second:?}");
    tokio::time::advance(after_ttft(&second)).await;
    state.picker.dispatch_once().await;
    let third = third.answer(short()).await;
    assert!(third.queued.is_some(), "two unreported past their first token still count as one: {third:?}");
    state.fleet.first_token(AssignmentId(1), first.predicted_ttft_ms, Instant::now());
    state.picker.dispatch_once().await;
    let Picked::Decided(third) = state.picker.pick_or_queue(&PickRequest { ticket: 3, ..of(3) }, Deadline::default()).await else {
        panic!("the first's report came and the second is past its first token")
    };
    assert_eq!(third.worker_id, "a");
}

/// A queued pick that no worker holds any of goes one engine step before the pick ahead of it
/// on its worker is due, so that vLLM fills the step that ends that prefill from its waiting
/// queue; one that some worker holds part of waits until that pick is due (the worker best for
/// it then may be another).
#[tokio::test(start_paused = true)]
async fn a_pick_no_worker_holds_goes_a_step_before_its_worker_is_due_one_held_somewhere_waits() {
    use kvroute_state::pick::Picked;
    use std::time::Duration;
    // One step of the default priors: 15 ms + 2,048 tokens at 0.1 ms.
    let step = Duration::from_secs_f64((15.0 + 2048.0 * 0.1) / 1000.0);
    let of = |id: u64| PickRequest { assignment_id: id, ..req("m", &tokens(id as u32 * 100_000..id as u32 * 100_000 + 20_000)) };
    for held in [false, true] {
        let (state, index) = state_with(vec![worker("a")], |c| {
            c.scheduling.enabled = true;
            c.scheduling.wait_ms = 10_000;
        });
        let Picked::Decided(first) = state.picker.pick_or_queue(&of(1), Deadline::default()).await else { panic!("an idle worker") };
        if held {
            store(&index, 0, &tokens(200_000..202_000), None);
        }
        let Picked::Queued(second) = state.picker.pick_or_queue(&of(2), Deadline::default()).await else {
            panic!("a's unstarted pick, ten steps from its first token, saturates it")
        };
        let due = Duration::from_secs_f64(first.predicted_ttft_ms / 1000.0);
        assert!(due > step * 5, "{due:?}");
        tokio::time::advance(due - step / 2).await;
        state.picker.dispatch_once().await;
        let short = Some(std::time::Instant::now() + Duration::from_millis(5));
        let early = second.answer(short).await;
        if !held {
            assert_eq!(early.worker_id, "a", "held nowhere: sent a step before the first is due: {early:?}");
            continue;
        }
        assert!(early.queued.is_some(), "a holds part of it: it waits for the first to be due: {early:?}");
        let Picked::Queued(second) = state.picker.pick_or_queue(&PickRequest { ticket: 2, ..of(2) }, Deadline::default()).await else { panic!("still queued") };
        tokio::time::advance(step).await;
        state.picker.dispatch_once().await;
        let later = tokio::time::timeout(Duration::from_secs(1), second.decision()).await.expect("dispatched once the first is due");
        assert_eq!((later.worker_id.as_str(), later.matched_blocks), ("a", 125));
    }
}
