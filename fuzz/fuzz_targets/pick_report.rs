//! The pick / report wire messages, as the state service decodes them from `/v1/pick` and
//! `/v1/report` bodies (protobuf from the filter, JSON from anyone), and what the service then
//! does with them: `Picker::pick` and `Reporter::apply` on a state
//! with a few workers and a real index, no network. The filter's side (`PickResponse`) is
//! decoded too.
//!
//! Input layout: every decoder runs on the whole input first. Then byte 0 is a set of flags,
//! bytes 1..3 the length (LE u16) of the pick body that follows, and the rest is a report
//! batch body:
//! - bits 0-2: the policy (`Policy::ALL`);
//! - bit 3: the bodies are JSON (else protobuf);
//! - bit 4: the pick names the served model `m` (a fuzzer cannot guess a hashed model name);
//! - bit 5: the reports name the assignment the pick just made;
//! - bit 6: the workers report load (running / waiting / KV usage);
//! - bit 7: the pick's keys start with blocks the index holds.
//!
//! The state is built once and put back after every input (assignments, learned routes,
//! calibration, load and suspicion reset), so an input's behaviour does not depend on earlier
//! ones. Oracles beyond "no panic": protobuf re-encoding is stable, JSON re-parses, a pick's
//! worker serves the model and its matched blocks never exceed the request's.
#![no_main]

use kvroute_core::keys::{token_block_keys, KeyRoot};
use kvroute_core::wire::{PickRequest, PickResponse, Report, ReportBatch};
use kvroute_state::config::{Config, WorkerConfig};
use kvroute_kv::index::memory::MemoryIndex;
use kvroute_kv::index::KvIndex;
use kvroute_kv::types::{EngineHash, KvEvent, Tier};
use kvroute_score::Policy;
use kvroute_state::app::App;
use kvroute_state::load::parse::VllmLoad;
use kvroute_state::load::LoadState;
use kvroute_state::pick::Deadline;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

const MODEL: &str = "m";
const BS: usize = 16;
/// At most this many reports of a batch are applied (the batch is still decoded whole).
const MAX_REPORTS: usize = 64;

struct Fixture {
    state: App,
    /// Drives the (async) pick: it completes without I/O here (no tokenizer, no worker
    /// fallback, no wait for unknown response ids).
    rt: tokio::runtime::Runtime,
    /// Keys of the prompt `0..HELD_TOKENS`; worker `a` holds all its blocks, `b` half.
    held: Vec<u64>,
}

const HELD_TOKENS: u32 = 8 * BS as u32;

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let mut config = Config { seed: Some(7), ..Config::default() };
        for (i, (id, model, bs, ranks)) in [("a", MODEL, 16, 1), ("b", MODEL, 16, 1), ("c", MODEL, 16, 2), ("d", "m4", 4, 1)].into_iter().enumerate() {
            config.workers.push(WorkerConfig {
                endpoint: format!("127.0.0.1:{}", 8000 + i),
                cluster: format!("c_{id}"),
                block_size: Some(bs),
                dp_ranks: ranks,
                ..WorkerConfig::new(id, model)
            });
        }
        config.tokenization.worker_fallback = false;
        config.responses.unknown_wait_ms = 0;
        let index = Arc::new(MemoryIndex::new());
        let state = App::new(config, index.clone()).expect("valid fuzz config");
        let tokens: Vec<u32> = (0..HELD_TOKENS).collect();
        for (id, blocks) in [("a", 8), ("b", 4)] {
            let worker = state.fleet.worker(id).expect("worker");
            let n = blocks * BS;
            let stored = KvEvent::Stored {
                hashes: (0..blocks as u64).map(|h| EngineHash(h + 1)).collect(),
                parent: None,
                token_ids: tokens[..n].to_vec(),
                block_size: BS as u32,
                lora_name: None,
                cache_salt: None,
                tier: Tier::Gpu,
            };
            index.apply(worker.engines[0].slot, MODEL, BS as u32, &[stored]);
        }
        let held = token_block_keys(&KeyRoot::new(MODEL, ""), &tokens, BS).iter().map(|k| k.0).collect();
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
        Fixture { state, rt, held }
    })
}

fuzz_target!(|data: &[u8]| {
    decode_all(data);
    let (Some(&flags), Some(len)) = (data.first(), data.get(1..3)) else { return };
    let rest = &data[3..];
    let split = usize::from(u16::from_le_bytes([len[0], len[1]])).min(rest.len());
    let (pick_body, report_body) = rest.split_at(split);
    drive(flags, pick_body, report_body);
});

/// Every decoder the service and the filter run on these bodies, on the same bytes.
fn decode_all(data: &[u8]) {
    proto_stable::<PickRequest>(data);
    proto_stable::<ReportBatch>(data);
    proto_stable::<PickResponse>(data);
    if let Ok(req) = serde_json::from_slice::<PickRequest>(data) {
        let back: PickRequest = serde_json::from_slice(&serde_json::to_vec(&req).expect("serializes")).expect("re-parses");
        assert_eq!(back, req);
    }
    if let Ok(batch) = serde_json::from_slice::<ReportBatch>(data) {
        let back: ReportBatch = serde_json::from_slice(&serde_json::to_vec(&batch).expect("serializes")).expect("re-parses");
        // serde_json's default float parsing is not always correctly rounded: compare the rest.
        assert_eq!(back.reports.len(), batch.reports.len());
        for (a, b) in back.reports.iter().zip(&batch.reports) {
            assert_eq!(Report { elapsed_ms: 0.0, ..a.clone() }, Report { elapsed_ms: 0.0, ..b.clone() });
        }
    }
    if let Ok(resp) = serde_json::from_slice::<PickResponse>(data) {
        let back: PickResponse = serde_json::from_slice(&serde_json::to_vec(&resp).expect("serializes")).expect("re-parses");
        assert_eq!(PickResponse { predicted_ttft_ms: 0.0, ..back }, PickResponse { predicted_ttft_ms: 0.0, ..resp });
    }
}

/// A decoded message re-encodes to bytes that decode to the same encoding.
fn proto_stable<M: Message + Default>(data: &[u8]) {
    if let Ok(m) = M::decode(data) {
        let once = m.encode_to_vec();
        let again = M::decode(once.as_slice()).expect("re-encoded message decodes").encode_to_vec();
        assert_eq!(once, again);
    }
}

fn decode<M: Message + Default + serde::de::DeserializeOwned>(json: bool, body: &[u8]) -> Option<M> {
    if json {
        serde_json::from_slice(body).ok()
    } else {
        M::decode(body).ok()
    }
}

fn drive(flags: u8, pick_body: &[u8], report_body: &[u8]) {
    let fx = fixture();
    let state = &fx.state;
    let json = flags & 0x08 != 0;
    state.picker.set_policy(Policy::ALL[usize::from(flags & 0x07)]);
    if flags & 0x40 != 0 {
        for (i, w) in state.fleet.workers().iter().enumerate() {
            let load = VllmLoad { running: 3 * i as u32, waiting: 7 * (i as u32 % 2), kv_usage: 0.3 * i as f64, ..VllmLoad::default() };
            w.load.lock().record_ok(load, Instant::now().into());
        }
    }
    let mut assignment = 0;
    if let Some(mut req) = decode::<PickRequest>(json, pick_body) {
        if flags & 0x10 != 0 {
            req.model = MODEL.into();
        }
        if flags & 0x80 != 0 {
            let n = req.token_keys.len() % (fx.held.len() + 1);
            req.token_keys.splice(0..0, fx.held[..n].iter().copied());
        }
        let resp = fx.rt.block_on(state.picker.pick(&req, Deadline::default()));
        if verbose() {
            eprintln!("pick {req:?}\n  -> {resp:?}");
        }
        check_pick(state, &req, &resp);
        assignment = resp.assignment_id;
    }
    if let Some(mut batch) = decode::<ReportBatch>(json, report_body) {
        batch.reports.truncate(MAX_REPORTS);
        for report in &mut batch.reports {
            if flags & 0x20 != 0 && assignment != 0 {
                report.assignment_id = assignment;
            }
            let outcome = state.reporter.apply(report);
            if verbose() {
                eprintln!("report {report:?}\n  -> {outcome:?}");
            }
        }
    }
    restore(state);
}

fn check_pick(state: &App, req: &PickRequest, resp: &PickResponse) {
    let once = resp.encode_to_vec();
    assert_eq!(PickResponse::decode(once.as_slice()).expect("response decodes").encode_to_vec(), once);
    serde_json::to_vec(resp).expect("response serializes as JSON");
    if resp.worker_id.is_empty() {
        return;
    }
    let worker = state.fleet.worker(&resp.worker_id).expect("the pick names a registered worker");
    assert_eq!(worker.config.model, req.model, "{resp:?}");
    assert!(resp.matched_blocks <= resp.total_blocks, "{req:?}\n{resp:?}");
}

/// `KVROUTE_FUZZ_VERBOSE=1`: print each pick and report (to check seeds and crashes).
fn verbose() -> bool {
    static VERBOSE: OnceLock<bool> = OnceLock::new();
    *VERBOSE.get_or_init(|| std::env::var_os("KVROUTE_FUZZ_VERBOSE").is_some())
}

/// Puts the fixture back: no assignment, learned route, calibration, load or suspicion left.
fn restore(state: &App) {
    state.picker.reset();
    for w in state.fleet.workers() {
        *w.load.lock() = LoadState::default();
    }
}
