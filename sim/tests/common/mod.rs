//! Shared helpers for the integration tests: start a small cluster on free ports, and a
//! minimal KV-event subscriber (SUB + DEALER replay) written against the wire format.

#![allow(dead_code)]

use kvroute_sim::chat::ChatTokenizer;
use kvroute_sim::cluster::{Cluster, ClusterConfig};
use kvroute_sim::engine::{EngineConfig, StepProfile};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

pub async fn start(workers: usize, num_gpu_blocks: usize) -> Cluster {
    start_dp(workers, 1, num_gpu_blocks, 0.01).await
}

/// `dp_size` ranks per worker, steps scaled by `time_scale`.
pub async fn start_dp(workers: usize, dp_size: usize, num_gpu_blocks: usize, time_scale: f64) -> Cluster {
    let cfg = ClusterConfig {
        workers,
        dp_size,
        http_port: 0,
        zmq_port: 0,
        engine: EngineConfig {
            num_gpu_blocks,
            eos_after: 4,
            time_scale,
            profile: StepProfile::default(),
            ..EngineConfig::default()
        },
        ..ClusterConfig::default()
    };
    Cluster::start(cfg, Arc::new(ChatTokenizer::byte_fallback())).await.expect("start cluster")
}

/// Applies event batches to a block set per medium, tracking the next expected sequence
/// number. `AllBlocksCleared` is the GPU pool's: it leaves the CPU tier's set alone.
#[derive(Default)]
pub struct Mirror {
    /// `medium: "GPU"` blocks.
    pub blocks: BTreeSet<u64>,
    /// `medium: "CPU"` blocks (the offload tier).
    pub cpu_blocks: BTreeSet<u64>,
    pub next_seq: u64,
    pub gaps: u64,
    /// Every `data_parallel_rank` the applied batches carried.
    pub ranks: BTreeSet<i64>,
}

impl Mirror {
    pub fn apply(&mut self, seq: u64, payload: &[u8]) {
        assert_eq!(seq, self.next_seq, "apply in order");
        let v = rmpv::decode::read_value(&mut &payload[..]).expect("msgpack");
        let batch = v.as_array().expect("batch array");
        self.ranks.insert(batch[2].as_i64().expect("data_parallel_rank"));
        for ev in batch[1].as_array().expect("events") {
            let map = ev.as_map().expect("event map");
            let get = |k: &str| map.iter().find(|(kk, _)| kk.as_str() == Some(k)).map(|(_, v)| v.clone());
            let hashes = || -> Vec<u64> {
                get("block_hashes").and_then(|h| h.as_array().cloned()).unwrap_or_default().iter().filter_map(|h| h.as_u64()).collect()
            };
            let medium = get("medium").and_then(|m| m.as_str().map(str::to_string));
            let set = match medium.as_deref() {
                Some("CPU") => &mut self.cpu_blocks,
                _ => &mut self.blocks,
            };
            match get("type").and_then(|t| t.as_str().map(str::to_string)).as_deref() {
                Some("BlockStored") => set.extend(hashes()),
                Some("BlockRemoved") => hashes().iter().for_each(|h| {
                    set.remove(h);
                }),
                Some("AllBlocksCleared") => self.blocks.clear(),
                other => panic!("unknown event {other:?}"),
            }
        }
        self.next_seq = seq + 1;
    }

    /// Ask the replay socket for everything from `next_seq` on and apply it.
    pub fn replay(&mut self, ctx: &zmq::Context, endpoint: &str) {
        let dealer = ctx.socket(zmq::DEALER).unwrap();
        dealer.set_rcvtimeo(5000).unwrap();
        dealer.set_linger(0).unwrap();
        dealer.connect(endpoint).unwrap();
        dealer.send_multipart([&b""[..], &self.next_seq.to_be_bytes()], 0).unwrap();
        loop {
            let frames = dealer.recv_multipart(0).expect("replay reply");
            assert_eq!(frames.len(), 4, "[empty, topic, seq, payload]");
            let seq = u64::from_be_bytes(frames[2].as_slice().try_into().unwrap());
            if seq == u64::MAX {
                assert!(frames[3].is_empty());
                return;
            }
            if seq >= self.next_seq {
                self.apply(seq, &frames[3]);
            }
        }
    }
}

pub struct Subscriber {
    pub sub: zmq::Socket,
}

impl Subscriber {
    pub fn connect(ctx: &zmq::Context, endpoint: &str) -> Self {
        let sub = ctx.socket(zmq::SUB).unwrap();
        sub.set_subscribe(b"").unwrap();
        sub.set_rcvtimeo(50).unwrap();
        sub.connect(endpoint).unwrap();
        Subscriber { sub }
    }

    /// Drain live messages into the mirror, repairing gaps through replay; stops once the
    /// mirror has seen every sequence number below `upto`.
    pub fn sync(&self, m: &mut Mirror, ctx: &zmq::Context, replay: &str, upto: u64) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while m.next_seq < upto {
            assert!(std::time::Instant::now() < deadline, "subscriber stuck at {} < {upto}", m.next_seq);
            match self.sub.recv_multipart(0) {
                Ok(f) => {
                    let seq = u64::from_be_bytes(f[1].as_slice().try_into().unwrap());
                    if seq < m.next_seq {
                        continue;
                    }
                    if seq > m.next_seq {
                        m.gaps += 1;
                        m.replay(ctx, replay);
                    }
                    if seq == m.next_seq {
                        m.apply(seq, &f[2]);
                    }
                }
                Err(_) => m.replay(ctx, replay), // quiet: catch up from the buffer
            }
        }
    }
}

pub async fn state(client: &reqwest::Client, http: &str) -> serde_json::Value {
    client.get(format!("{http}/sim/state")).send().await.unwrap().json().await.unwrap()
}

pub fn engine_blocks(state: &serde_json::Value) -> BTreeSet<u64> {
    state["cached_block_hashes"].as_array().unwrap().iter().map(|h| h.as_u64().unwrap()).collect()
}

/// What the CPU offload tier holds, as `/sim/state` reports it.
pub fn cpu_blocks(state: &serde_json::Value) -> BTreeSet<u64> {
    state["cpu_cached_block_hashes"].as_array().unwrap().iter().map(|h| h.as_u64().unwrap()).collect()
}

/// One worker with the given engine configuration, on free ports.
pub async fn start_engine(engine: EngineConfig) -> Cluster {
    let cfg = ClusterConfig { workers: 1, http_port: 0, zmq_port: 0, engine, ..ClusterConfig::default() };
    Cluster::start(cfg, Arc::new(ChatTokenizer::byte_fallback())).await.expect("start cluster")
}

pub async fn complete(client: &reqwest::Client, http: &str, prompt: Vec<u32>, max_tokens: u32) -> serde_json::Value {
    let body = serde_json::json!({"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": true});
    let r = client.post(format!("{http}/v1/completions")).json(&body).send().await.unwrap();
    assert!(r.status().is_success(), "status {}", r.status());
    r.json().await.unwrap()
}
