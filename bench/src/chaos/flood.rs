//! A flooding worker: its event stream announces far more blocks than the capacity its
//! `/metrics` reports (`POST /sim/fault {"flood_blocks": n}`: distinct one-block prefixes it
//! never holds). Its index must stay within that capacity (times the state service's
//! `resilience.index_capacity_factor`), the overflow counted, and the memory of the state
//! replicas and Redis must come back once the worker resets its cache (`/reset_prefix_cache`,
//! once the load is over: vLLM refuses it while requests hold blocks).

use crate::stack::Stack;
use crate::BenchError;
use std::time::{Duration, Instant};

/// What one flood left.
#[derive(Clone, Debug, serde::Serialize)]
pub struct FloodResult {
    pub worker: usize,
    pub blocks: u64,
    /// GPU blocks the worker's `/metrics` reports.
    pub reported_blocks: Option<u64>,
    /// The most blocks any replica's index held for the worker while it flooded.
    pub index_blocks_max: u64,
    /// Blocks the replicas dropped as over capacity (`events_rejected{kind="over_capacity"}`).
    pub over_capacity: u64,
    /// Summed over the state replicas, MiB: before, at the peak, after the reset.
    pub state_rss_mib: [f64; 3],
    /// Summed over the Redis shards (none: the in-memory store), MiB.
    pub redis_rss_mib: [f64; 3],
    pub index_blocks_after_reset: u64,
    /// Seconds from the flood's start until the replicas had dropped all they would (the
    /// over-capacity count stopped growing).
    pub secs: f64,
}

async fn text(client: &reqwest::Client, url: &str) -> Option<String> {
    client.get(url).timeout(Duration::from_secs(2)).send().await.ok()?.text().await.ok()
}

/// Worker `w{i}`'s index, as each replica sees it; the largest.
async fn index_blocks(client: &reqwest::Client, replicas: &[String], i: usize) -> u64 {
    let mut most = 0;
    for r in replicas {
        let Some(v) = text(client, &format!("{r}/v1/workers")).await.and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok()) else { continue };
        let id = format!("w{i}");
        let blocks = v["workers"].as_array().and_then(|ws| ws.iter().find(|w| w["id"].as_str() == Some(id.as_str()))).and_then(|w| w["index_blocks"].as_u64());
        most = most.max(blocks.unwrap_or(0));
    }
    most
}

/// `kvroute_events_rejected_total` with `kind="over_capacity"`, summed over the replicas.
async fn over_capacity(client: &reqwest::Client, replicas: &[String]) -> u64 {
    let mut n = 0.0;
    for r in replicas {
        let Some(t) = text(client, &format!("{r}/metrics")).await else { continue };
        n += t
            .lines()
            .filter(|l| l.starts_with("kvroute_events_rejected_total{") && l.contains("kind=\"over_capacity\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
    }
    n as u64
}

/// `num_gpu_blocks` from vLLM's `cache_config_info` on the worker's `/metrics`.
fn reported_blocks(metrics: &str) -> Option<u64> {
    let line = metrics.lines().find(|l| l.starts_with("vllm:cache_config_info{"))?;
    let rest = &line[line.find("num_gpu_blocks=\"")? + "num_gpu_blocks=\"".len()..];
    rest[..rest.find('"')?].parse().ok()
}

/// The state replicas' and the Redis shards' RSS, each summed, MiB.
fn rss(stack: &Stack) -> (f64, f64) {
    let sum = |names: Vec<String>| names.iter().filter_map(|n| stack.rss_mib(n)).sum::<f64>();
    (sum((0..stack.config.replicas.max(1)).map(Stack::replica_name).collect()), sum((0..stack.config.redis_shards).map(|k| format!("redis{k}")).collect()))
}

/// Floods worker `i` with `blocks` blocks and waits until the replicas have taken them all
/// (the over-capacity count the same for 2 s); [`reset`] measures what is left after.
pub async fn run(stack: &Stack, control: &reqwest::Client, replicas: &[String], i: usize, blocks: u64) -> Result<FloodResult, BenchError> {
    let sim = stack.worker_urls().get(i).cloned().ok_or_else(|| BenchError::Stack(format!("no worker {i}")))?;
    let reported = text(control, &format!("{sim}/metrics")).await.as_deref().and_then(reported_blocks);
    let over_before = over_capacity(control, replicas).await;
    let (state0, redis0) = rss(stack);
    let (mut state_peak, mut redis_peak, mut most) = (state0, redis0, 0);
    let r = control
        .post(format!("{sim}/sim/fault"))
        .json(&serde_json::json!({ "flood_blocks": blocks }))
        .send()
        .await
        .map_err(|e| BenchError::Stack(format!("flood: {e}")))?;
    if !r.status().is_success() {
        return Err(BenchError::Stack(format!("flood answered {}", r.status())));
    }
    let start = Instant::now();
    let (mut over, mut changed) = (over_before, start);
    while start.elapsed() < Duration::from_secs(300) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let held = index_blocks(control, replicas, i).await;
        let (s, r) = rss(stack);
        (state_peak, redis_peak, most) = (state_peak.max(s), redis_peak.max(r), most.max(held));
        let now = over_capacity(control, replicas).await;
        if now != over {
            (over, changed) = (now, Instant::now());
        } else if over > over_before && changed.elapsed() >= Duration::from_secs(2) {
            break;
        }
    }
    let secs = changed.duration_since(start).as_secs_f64();
    Ok(FloodResult {
        worker: i,
        blocks,
        reported_blocks: reported,
        index_blocks_max: most,
        over_capacity: over.saturating_sub(over_before),
        state_rss_mib: [state0, state_peak, f64::NAN],
        redis_rss_mib: [redis0, redis_peak, f64::NAN],
        index_blocks_after_reset: most,
        secs,
    })
}

/// Once the load is over (the worker idle): resets the flooding worker's cache and measures
/// its index and the memory again.
pub async fn reset(f: &mut FloodResult, stack: &Stack, control: &reqwest::Client, replicas: &[String]) -> Result<(), BenchError> {
    let sim = stack.worker_urls().get(f.worker).cloned().ok_or_else(|| BenchError::Stack(format!("no worker {}", f.worker)))?;
    let r = control.post(format!("{sim}/reset_prefix_cache")).send().await.map_err(|e| BenchError::Stack(format!("reset: {e}")))?;
    if !r.status().is_success() {
        return Err(BenchError::Stack(format!("reset answered {}", r.status())));
    }
    // The index empties on the worker's `AllBlocksCleared`; memory given back to the
    // allocator shows after a while.
    tokio::time::sleep(Duration::from_secs(3)).await;
    f.index_blocks_after_reset = index_blocks(control, replicas, f.worker).await;
    let (state, redis) = rss(stack);
    (f.state_rss_mib[2], f.redis_rss_mib[2]) = (state, redis);
    Ok(())
}

/// The floods as a markdown table.
pub fn table(floods: &[&FloodResult]) -> String {
    let mut t = String::from(
        "| flooding worker | blocks announced (taken in) | capacity it reports | index held at most | dropped as over capacity (all replicas) | state replicas RSS before / peak / after its reset | Redis RSS before / peak / after | index after its reset |\n|---|---|---|---|---|---|---|---|\n",
    );
    let mib = |v: [f64; 3]| format!("{:.0} / {:.0} / {:.0} MiB", v[0], v[1], v[2]);
    for f in floods {
        t.push_str(&format!(
            "| worker {} | {} in {:.0} s | {} | {} | {} | {} | {} | {} |\n",
            f.worker,
            f.blocks,
            f.secs,
            f.reported_blocks.map_or("-".to_string(), |b| b.to_string()),
            f.index_blocks_max,
            f.over_capacity,
            mib(f.state_rss_mib),
            mib(f.redis_rss_mib),
            f.index_blocks_after_reset
        ));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reported_capacity_is_read_from_vllm_metrics() {
        let m = "# HELP x\nvllm:cache_config_info{block_size=\"16\",engine=\"0\",num_cpu_blocks=\"None\",num_gpu_blocks=\"3000\"} 1.0\n";
        assert_eq!(reported_blocks(m), Some(3000));
        assert_eq!(reported_blocks("vllm:num_requests_running 0\n"), None);
    }

    #[test]
    fn the_table_has_one_row_per_flood() {
        let f = FloodResult {
            worker: 3,
            blocks: 1_000_000,
            reported_blocks: Some(3000),
            index_blocks_max: 6200,
            over_capacity: 993_800,
            state_rss_mib: [40.0, 60.4, 42.0],
            redis_rss_mib: [10.0, 30.0, 11.0],
            index_blocks_after_reset: 0,
            secs: 12.3,
        };
        let t = table(&[&f]);
        assert!(t.contains("| worker 3 | 1000000 in 12 s | 3000 | 6200 | 993800 | 40 / 60 / 42 MiB | 10 / 30 / 11 MiB | 0 |"), "{t}");
    }
}
