//! Shared test fixtures: a tiny reference KvIndex and a two-worker state.
#![allow(dead_code)]

use kvroute_state::config::{Config, WorkerConfig};
use kvroute_kv::index::{ApplyStats, KvIndex, PrefixMatch};
use kvroute_state::app::App;
use kvroute_kv::types::{BlockKey, EngineSlot, KvEvent};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Holds whatever the test puts in; ignores events.
#[derive(Default)]
pub struct TestIndex {
    pub blocks: Mutex<HashMap<EngineSlot, HashSet<BlockKey>>>,
}

impl TestIndex {
    pub fn hold(&self, engine: EngineSlot, keys: &[u64]) {
        self.blocks.lock().entry(engine).or_default().extend(keys.iter().map(|k| BlockKey(*k)));
    }
}

impl KvIndex for TestIndex {
    fn apply(&self, _: EngineSlot, _: &str, _: u32, _: &[KvEvent]) -> ApplyStats {
        ApplyStats::default()
    }
    fn clear_engine(&self, engine: EngineSlot) {
        self.blocks.lock().remove(&engine);
    }
    fn match_prefix(&self, keys: &[BlockKey]) -> Vec<PrefixMatch> {
        let blocks = self.blocks.lock();
        blocks
            .iter()
            .map(|(engine, held)| {
                let n = keys.iter().take_while(|k| held.contains(k)).count() as u32;
                PrefixMatch { engine: *engine, matched_blocks: n, gpu_blocks: n }
            })
            .filter(|m| m.matched_blocks > 0)
            .collect()
    }
    fn engine_blocks(&self, engine: EngineSlot) -> usize {
        self.blocks.lock().get(&engine).map_or(0, |b| b.len())
    }
}

pub const TOKEN: &str = "secret";

pub fn config(workers: &[&str]) -> Config {
    let mut config = Config { admin_token: Some(TOKEN.into()), seed: Some(7), ..Config::default() };
    for id in workers {
        let port = 8000 + config.workers.len();
        config.workers.push(WorkerConfig { endpoint: format!("127.0.0.1:{port}"), cluster: format!("c_{id}"), ..WorkerConfig::new(id, "m") });
    }
    config
}

pub fn state(workers: &[&str]) -> (App, Arc<TestIndex>) {
    let index = Arc::new(TestIndex::default());
    let state = App::new(config(workers), index.clone()).expect("valid test config");
    (state, index)
}

/// The pick the filter sends for a chat-like `body` (chat completions, Responses) to `api`:
/// its template input, text-chunk keys and prompt bytes; and the template input.
pub fn filter_pick(api: kvroute_core::request::Api, body: &serde_json::Value) -> (kvroute_core::wire::PickRequest, String) {
    use kvroute_core::keys::{text_chunk_keys, KeyRoot, DEFAULT_TEXT_CHUNK_BYTES};
    let parsed = kvroute_core::request::parse(api, body.to_string().as_bytes()).expect("a valid body");
    let kvroute_core::request::Prompt::Chat { template_input, canonical } = parsed.prompt else { panic!("not a chat prompt") };
    let root = KeyRoot::new("m", "");
    let pick = kvroute_core::wire::PickRequest {
        model: "m".into(),
        endpoint: api.wire() as i32,
        block_size: 16,
        chat_json: template_input.clone(),
        text_chunk_keys: text_chunk_keys(&root, &canonical, DEFAULT_TEXT_CHUNK_BYTES).into_iter().map(|k| k.0).collect(),
        prompt_bytes: canonical.len() as u32,
        ..Default::default()
    };
    (pick, template_input)
}
