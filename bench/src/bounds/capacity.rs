//! The fleet's KV capacity, for the oracle bound: every worker's GPU blocks (all
//! data-parallel ranks) plus its CPU-tier blocks when it has one, times the block size.
//!
//! Sources, best first: the workers' own `vllm:cache_config_info` series (`block_size`,
//! `num_gpu_blocks`, and `num_cpu_blocks` where a worker reports a number), scraped once
//! before the first pass; else the flags the bench starts the sims with (`--workers`, and
//! in `--sim-arg`: `--num-gpu-blocks`, `--block-size`, `--dp-size`, `--cpu-blocks` (the
//! sim's CPU offload tier, per engine; `--num-cpu-blocks` is read too),
//! `--worker-override i:num_gpu_blocks=N,cpu_blocks=M`), with the sim's defaults (5600
//! blocks of 16 tokens, one rank, no CPU tier); `--oracle-capacity-tokens` overrides both.
//! The sims' `cache_config_info` carries no CPU block count, so with a CPU tier the
//! capacity is `metrics+flags`.

use crate::control::parse_series;
use serde::{Deserialize, Serialize};

pub const SIM_DEFAULT_GPU_BLOCKS: u64 = 5600;
pub const SIM_DEFAULT_BLOCK_SIZE: usize = 16;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Capacity {
    pub block_size: usize,
    /// Summed over all workers and their data-parallel ranks.
    pub gpu_blocks: u64,
    pub cpu_blocks: u64,
    /// Engines counted (workers x ranks).
    pub engines: usize,
    /// `metrics`, `flags`, `metrics+flags` (CPU blocks from the flags) or `override`.
    pub source: String,
}

impl Capacity {
    pub fn total_blocks(&self) -> u64 {
        self.gpu_blocks + self.cpu_blocks
    }

    pub fn total_tokens(&self) -> u64 {
        self.total_blocks() * self.block_size as u64
    }

    /// `--oracle-capacity-tokens`: the whole fleet's capacity, in this block size.
    pub fn with_total_tokens(self, tokens: u64) -> Capacity {
        let bs = self.block_size.max(1);
        Capacity { gpu_blocks: tokens / bs as u64, cpu_blocks: 0, source: "override".into(), ..self }
    }

    /// From the sims' flags (what `kvroute-bench stack` passes them).
    pub fn from_sim_args(workers: usize, sim_args: &[String]) -> Capacity {
        let flags = SimFlags::parse(sim_args);
        let gpu: u64 = (0..workers).map(|w| flags.gpu_overrides.get(&w).copied().unwrap_or(flags.gpu_blocks)).sum();
        let dp = flags.dp_size.max(1) as u64;
        Capacity {
            block_size: flags.block_size,
            gpu_blocks: gpu * dp,
            cpu_blocks: flags.cpu_total(workers),
            engines: workers * flags.dp_size.max(1),
            source: "flags".into(),
        }
    }

    /// From each worker's `/metrics` text; `None` unless every worker reports
    /// `vllm:cache_config_info` with a block size and GPU block count. `cpu_from_flags`
    /// fills in CPU blocks the metrics do not carry.
    pub fn from_cache_config(texts: &[String], cpu_from_flags: u64) -> Option<Capacity> {
        let mut cap = Capacity { block_size: 0, gpu_blocks: 0, cpu_blocks: 0, engines: 0, source: "metrics".into() };
        let mut cpu_seen = false;
        for text in texts {
            let mut found = false;
            for s in parse_series(text).into_iter().filter(|s| s.name == "vllm:cache_config_info") {
                let num = |k: &str| s.label(k).and_then(|v| v.parse::<u64>().ok());
                let (Some(bs), Some(gpu)) = (num("block_size"), num("num_gpu_blocks")) else { continue };
                if cap.block_size == 0 {
                    cap.block_size = bs as usize;
                }
                // Mixed block sizes: count the same tokens in the first worker's blocks.
                cap.gpu_blocks += gpu * bs / cap.block_size as u64;
                if let Some(cpu) = num("num_cpu_blocks") {
                    cap.cpu_blocks += cpu * bs / cap.block_size as u64;
                    cpu_seen = true;
                }
                cap.engines += 1;
                found = true;
            }
            if !found {
                return None;
            }
        }
        if cap.engines == 0 || cap.block_size == 0 {
            return None;
        }
        if !cpu_seen && cpu_from_flags > 0 {
            cap.cpu_blocks = cpu_from_flags;
            cap.source = "metrics+flags".into();
        }
        Some(cap)
    }
}

/// The capacity-related `kvroute-sim` flags.
#[derive(Debug, PartialEq)]
pub struct SimFlags {
    pub gpu_blocks: u64,
    pub cpu_blocks: u64,
    pub block_size: usize,
    pub dp_size: usize,
    pub gpu_overrides: std::collections::BTreeMap<usize, u64>,
    pub cpu_overrides: std::collections::BTreeMap<usize, u64>,
}

impl SimFlags {
    pub fn parse(args: &[String]) -> SimFlags {
        let mut f = SimFlags {
            gpu_blocks: SIM_DEFAULT_GPU_BLOCKS,
            cpu_blocks: 0,
            block_size: SIM_DEFAULT_BLOCK_SIZE,
            dp_size: 1,
            gpu_overrides: Default::default(),
            cpu_overrides: Default::default(),
        };
        let mut i = 0;
        while i < args.len() {
            let (flag, inline) = match args[i].split_once('=') {
                Some((f, v)) if args[i].starts_with("--") => (f.to_string(), Some(v.to_string())),
                _ => (args[i].clone(), None),
            };
            let known = ["--num-gpu-blocks", "--num-cpu-blocks", "--cpu-blocks", "--block-size", "--dp-size", "--worker-override"];
            if !known.contains(&flag.as_str()) {
                i += 1;
                continue;
            }
            let value = match inline {
                Some(v) => v,
                None => {
                    i += 1;
                    args.get(i).cloned().unwrap_or_default()
                }
            };
            i += 1;
            let n = value.parse::<u64>().ok();
            match flag.as_str() {
                "--num-gpu-blocks" => f.gpu_blocks = n.unwrap_or(f.gpu_blocks),
                "--num-cpu-blocks" | "--cpu-blocks" => f.cpu_blocks = n.unwrap_or(f.cpu_blocks),
                "--block-size" => f.block_size = n.map_or(f.block_size, |n| (n as usize).max(1)),
                "--dp-size" => f.dp_size = n.map_or(f.dp_size, |n| (n as usize).max(1)),
                _ => {
                    // `INDEX:key=value,...`, as the sim takes it.
                    let Some((idx, kvs)) = value.split_once(':') else { continue };
                    let Ok(idx) = idx.parse::<usize>() else { continue };
                    for (k, v) in kvs.split(',').filter_map(|kv| kv.split_once('=')) {
                        let Ok(v) = v.parse::<f64>() else { continue };
                        match k {
                            "num_gpu_blocks" => {
                                f.gpu_overrides.insert(idx, v as u64);
                            }
                            "cpu_blocks" | "num_cpu_blocks" => {
                                f.cpu_overrides.insert(idx, v as u64);
                            }
                            _ => {}
                        }
                    }
                }
            }
        }
        f
    }

    /// CPU blocks over `workers` workers, as the flags say.
    pub fn cpu_total(&self, workers: usize) -> u64 {
        let per: u64 = (0..workers).map(|w| self.cpu_overrides.get(&w).copied().unwrap_or(self.cpu_blocks)).sum();
        per * self.dp_size.max(1) as u64
    }
}
