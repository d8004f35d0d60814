//! A small Prometheus text-format parser, just enough for vLLM's `/metrics`.
//!
//! Robust rather than strict: comment and unknown lines are skipped, label values may hold
//! escaped quotes, commas and braces, timestamps are ignored. A line we cannot read is
//! skipped, never an error: one odd metric must not take a worker out of the pool.

use std::collections::BTreeSet;

/// One sample line.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

/// Every sample of `text` that parses.
pub fn samples(text: &str) -> impl Iterator<Item = Sample> + '_ {
    text.lines().filter_map(|line| parse_line(line.trim()))
}

fn parse_line(line: &str) -> Option<Sample> {
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = &line[..name_end];
    let (labels, rest) = if line[name_end..].starts_with('{') {
        parse_labels(&line[name_end + 1..])?
    } else {
        (Vec::new(), &line[name_end..])
    };
    let value = rest.split_whitespace().next()?.parse::<f64>().ok()?;
    Some(Sample { name: name.to_string(), labels, value })
}

/// Parses `k="v",...}` and returns the labels and what follows the closing brace.
fn parse_labels(mut s: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start_matches([' ', ',']);
        if let Some(rest) = s.strip_prefix('}') {
            return Some((labels, rest));
        }
        let eq = s.find('=')?;
        let key = s[..eq].trim().to_string();
        s = s[eq + 1..].trim_start().strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        labels.push((key, value));
        s = &s[end + 1..];
    }
}

/// What the router reads from one vLLM server's metrics, summed over its engines.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VllmLoad {
    pub running: u32,
    pub waiting: u32,
    /// Mean over engines, 0..1.
    pub kv_usage: f64,
    pub block_size: Option<u32>,
    pub num_gpu_blocks: Option<u64>,
    /// vLLM's CPU swap/offload blocks when it reports a number (`None` otherwise).
    pub num_cpu_blocks: Option<u64>,
    /// Distinct `engine` label values seen.
    pub engines: u32,
}

/// Extracts the router's view from vLLM exposition text.
pub fn parse_vllm(text: &str) -> VllmLoad {
    let mut out = VllmLoad::default();
    let (mut running, mut waiting, mut usage_sum, mut usage_n) = (0.0, 0.0, 0.0, 0u32);
    let mut engines = BTreeSet::new();
    for s in samples(text).filter(|s| s.name.starts_with("vllm:") && s.value.is_finite()) {
        if let Some(e) = s.label("engine") {
            engines.insert(e.to_string());
        }
        match s.name.as_str() {
            "vllm:num_requests_running" => running += s.value.max(0.0),
            "vllm:num_requests_waiting" => waiting += s.value.max(0.0),
            "vllm:kv_cache_usage_perc" => {
                usage_sum += s.value.clamp(0.0, 1.0);
                usage_n += 1;
            }
            "vllm:cache_config_info" => {
                out.block_size = s.label("block_size").and_then(|v| v.parse().ok()).or(out.block_size);
                let blocks: Option<u64> = s.label("num_gpu_blocks").and_then(|v| v.parse().ok());
                out.num_gpu_blocks = blocks.map(|b| b.saturating_add(out.num_gpu_blocks.unwrap_or(0))).or(out.num_gpu_blocks);
                let cpu: Option<u64> = s.label("num_cpu_blocks").and_then(|v| v.parse().ok());
                out.num_cpu_blocks = cpu.map(|b| b.saturating_add(out.num_cpu_blocks.unwrap_or(0))).or(out.num_cpu_blocks);
            }
            _ => {}
        }
    }
    out.running = running.round() as u32;
    out.waiting = waiting.round() as u32;
    out.kv_usage = if usage_n > 0 { usage_sum / f64::from(usage_n) } else { 0.0 };
    out.engines = engines.len() as u32;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shaped like vLLM 0.x output with two data-parallel engines.
    const VLLM: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 3.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3-8B"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 4.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen3-8B"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen3-8B"} 0.25
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",calculate_kv_scales="False",engine="0",enable_prefix_caching="True",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="27000",prefix_caching_hash_algo="sha256"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="1",num_gpu_blocks="27000"} 1.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-8B"} 123456.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="Qwen/Qwen3-8B"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-8B"} 17.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="Qwen/Qwen3-8B"} 17.0
python_gc_objects_collected_total{generation="0"} 1234.0
process_resident_memory_bytes 1.2e+09
"#;

    #[test]
    fn reads_vllm_exposition() {
        let load = parse_vllm(VLLM);
        assert_eq!((load.running, load.waiting, load.engines), (5, 4, 2));
        assert!((load.kv_usage - 0.375).abs() < 1e-12);
        assert_eq!(load.block_size, Some(16));
        assert_eq!(load.num_gpu_blocks, Some(54000));
    }

    #[test]
    fn tolerates_escapes_timestamps_and_garbage() {
        let text = "m{a=\"x\\\"y,}z\",b=\"\\\\\"} 2 1700000000000\nm 1\nnot a metric line\nm{broken=\"} 3\n\nm NaN\nvllm:num_requests_waiting +Inf\n";
        let all: Vec<Sample> = samples(text).collect();
        assert_eq!(all[0].label("a"), Some("x\"y,}z"));
        assert_eq!(all[0].label("b"), Some("\\"));
        assert_eq!(all[0].value, 2.0);
        assert_eq!(all[1].value, 1.0);
        assert!(all.iter().any(|s| s.value.is_nan()));
        assert_eq!(parse_vllm(text).waiting, 0, "non-finite values are ignored");
        assert_eq!(parse_vllm(""), VllmLoad::default());
    }

    /// Found by fuzzing (fuzz/fuzz_targets/prometheus.rs): the engines' `num_gpu_blocks` were
    /// summed unchecked, so a worker reporting huge counts made the parser panic (overflow
    /// checks on) or wrap (off). The sum saturates.
    #[test]
    fn huge_block_counts_saturate() {
        let text = "vllm:cache_config_info{engine=\"0\",num_gpu_blocks=\"18446744073709551615\"} 1\n\
                    vllm:cache_config_info{engine=\"1\",num_gpu_blocks=\"2\"} 1\n";
        assert_eq!(parse_vllm(text).num_gpu_blocks, Some(u64::MAX));
    }
}
