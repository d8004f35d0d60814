//! Simulated vLLM workers (the `kvroute-sim` engine model, real ZMQ publishers with replay)
//! in this process, a load generator that keeps them publishing, and their `/sim/state`.

use super::support::*;
use kvroute_sim::chat::ChatTokenizer;
use kvroute_sim::cluster::{Cluster, ClusterConfig, WorkerLayout};
use kvroute_sim::engine::EngineConfig;
use kvroute_state::config::{Config, WorkerConfig};
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::runtime::Runtime;

pub struct Sims {
    pub rt: Runtime,
    pub layout: Vec<WorkerLayout>,
    _cluster: Cluster,
}

impl Sims {
    pub fn start(workers: usize) -> Sims {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        let cfg = ClusterConfig {
            workers,
            http_port: 0,
            zmq_port: 0,
            engine: EngineConfig { time_scale: 0.01, num_gpu_blocks: 400, ..EngineConfig::default() },
            ..ClusterConfig::default()
        };
        let cluster = rt.block_on(Cluster::start(cfg, Arc::new(ChatTokenizer::byte_fallback()))).expect("sims");
        Sims { layout: cluster.layout.clone(), rt, _cluster: cluster }
    }

    /// Adds the sims as workers `w0..` of `config`.
    pub fn add_workers(&self, config: &mut Config) {
        for (i, l) in self.layout.iter().enumerate() {
            let mut w = WorkerConfig::new(&format!("w{i}"), &l.model);
            w.endpoint = l.http.trim_start_matches("http://").to_string();
            w.events_endpoint = l.kv_events.clone();
            w.replay_endpoint = l.kv_replay.clone();
            w.metrics_url = Some(format!("{}/metrics", l.http));
            w.block_size = Some(l.block_size as u32);
            config.workers.push(w);
        }
    }

    /// `(cached engine hashes sorted, next_seq)` of worker `i`, publisher flushed.
    pub fn state(&self, i: usize) -> (Vec<u64>, u64) {
        let v = self.rt.block_on(async {
            reqwest::get(format!("{}/sim/state", self.layout[i].http)).await.expect("sim up").json::<serde_json::Value>().await.expect("JSON")
        });
        let mut hashes: Vec<u64> = v["cached_block_hashes"].as_array().expect("hashes").iter().filter_map(|h| h.as_u64()).collect();
        hashes.sort_unstable();
        (hashes, v["publisher"]["next_seq"].as_u64().expect("next_seq"))
    }

    /// Sends completions (prompts sharing prefixes, so blocks are stored, reused and evicted)
    /// to every worker until the returned flag is set; `join` waits for the last answers.
    pub fn load(&self, seed: u64) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, model) = (stop.clone(), self.layout[0].model.clone());
        let urls: Vec<String> = self.layout.iter().map(|l| format!("{}/v1/completions", l.http)).collect();
        let task = self.rt.spawn(async move {
            let client = reqwest::Client::new();
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            while !flag.load(Ordering::Relaxed) {
                let conv: u32 = rng.gen_range(0..30);
                let len = rng.gen_range(2..12) * 16 + rng.gen_range(0..16);
                let prompt: Vec<u32> = (0..len).map(|t| 1000 + conv * 97 + (t as u32 % 50)).collect();
                let url = &urls[rng.gen_range(0..urls.len())];
                let body = serde_json::json!({ "model": model, "prompt": prompt, "max_tokens": 2 });
                let _ = client.post(url).json(&body).send().await;
            }
        });
        Load { stop, task: Some(task) }
    }
}

pub struct Load {
    stop: Arc<AtomicBool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Load {
    pub fn finish(mut self, sims: &Sims) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.task.take() {
            let _ = sims.rt.block_on(t);
        }
    }
}

/// ZMQ drops what a PUB sends before a SUB is connected, so a subscriber that starts with
/// the workers misses their first batches. Sends single requests until `subscribed` sees
/// events from every worker, then clears the workers' caches (AllBlocksCleared), so from
/// here on the subscriber has seen everything the caches hold.
pub fn settle_subscription(sims: &Sims, mut subscribed: impl FnMut(usize) -> bool) {
    let model = sims.layout[0].model.clone();
    let mut attempt = 0u32;
    for (i, l) in sims.layout.iter().enumerate() {
        wait_until("the subscriber to see events", || {
            // A new prompt each time: a repeated one hits the cache and publishes nothing,
            // and the subscriber notices a missed first batch only from a later one.
            attempt += 1;
            let body = serde_json::json!({ "model": model, "prompt": (0..40).map(|t| attempt * 1000 + t).collect::<Vec<u32>>(), "max_tokens": 1 });
            sims.rt.block_on(async { reqwest::Client::new().post(format!("{}/v1/completions", l.http)).json(&body).send().await.is_ok() });
            subscribed(i)
        });
        let reset = sims.rt.block_on(async {
            let r = reqwest::Client::new().post(format!("{}/reset_prefix_cache", l.http)).send().await.expect("sim up");
            r.json::<serde_json::Value>().await.expect("JSON")
        });
        assert_eq!(reset["reset"], true, "{reset}");
    }
}

/// Waits until every worker's published sequence moved at least `n` past `from`.
pub fn wait_for_events(sims: &Sims, from: &[u64], n: u64) {
    wait_until("workers to publish", || (0..sims.layout.len()).all(|i| sims.state(i).1 >= from[i] + n));
}
