//! `/metrics` in Prometheus text format with vLLM's metric names and labels
//! (`model_name`, `engine`). Rendered straight from the engine's own counters, so what a
//! router scrapes is what the engine did. Only the families a router reads are emitted.
//! A worker with data-parallel ranks exposes one series per rank (`engine="<r>"`), as vLLM
//! labels every metric with its engine index.
//!
//! Besides vLLM's families, two simulator counters report reuse honestly per request (vLLM's
//! own `prefix_cache_*` count every scheduling attempt, preemptions included):
//! `kvroute_sim_prompt_tokens_first_scheduled_total` (prompt tokens at a request's first
//! scheduling) and `kvroute_sim_cached_tokens_first_scheduled_total{medium="GPU"|"CPU"}` (of
//! those, GPU prefix-cache hits and CPU offload-tier loads). A third,
//! `kvroute_sim_requests_aborted_total`, counts requests their frontend aborted (client gone,
//! Responses cancel), which vLLM counts nowhere. `vllm:prompt_tokens` and
//! `vllm:generation_tokens` count what vLLM's output processor counts: outputs delivered to a
//! request still listened for (see `EngineStats`).

use crate::engine::stats::{EngineStats, Histogram};
use crate::engine::Engine;
use std::fmt::Write;

pub struct MetricsInput<'a> {
    pub model: &'a str,
    /// `(engine index = DP rank, engine)`, one series per engine in every family.
    pub engines: &'a [(u32, &'a Engine)],
}

fn esc(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Metric families: name, help text, and how to read the value from an engine.
type Gauge = (&'static str, &'static str, fn(&Engine) -> f64);
type Counter = (&'static str, &'static str, fn(&EngineStats) -> u64);
type Hist = (&'static str, &'static str, fn(&EngineStats) -> &Histogram);

/// Render the exposition text: each family's HELP/TYPE once, then one series per engine.
pub fn render(m: &MetricsInput<'_>) -> String {
    let labels: Vec<String> = m.engines.iter().map(|(i, _)| format!("model_name=\"{}\",engine=\"{i}\"", esc(m.model))).collect();
    let series = || labels.iter().zip(m.engines.iter().map(|(_, e)| *e));
    let mut out = String::with_capacity(8192 * m.engines.len().max(1));
    let gauges: [Gauge; 3] = [
        ("vllm:num_requests_running", "Number of requests in model execution batches.", |e| e.num_running() as f64),
        ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", |e| e.num_waiting() as f64),
        ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", Engine::kv_usage),
    ];
    for (name, help, value) in gauges {
        let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n");
        for (l, e) in series() {
            let _ = writeln!(out, "{name}{{{l}}} {}", value(e));
        }
    }
    let _ = write!(out, "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\n");
    for (i, e) in m.engines {
        let cfg = e.config();
        let _ = writeln!(
            out,
            "vllm:cache_config_info{{block_size=\"{}\",cache_dtype=\"fp8\",enable_prefix_caching=\"True\",engine=\"{i}\",num_gpu_blocks=\"{}\",prefix_caching_hash_algo=\"sha256_cbor\"}} 1.0",
            cfg.block_size, cfg.num_gpu_blocks
        );
    }
    let counters: [Counter; 10] = [
        ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", |s| s.prefix_cache_queries),
        ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", |s| s.prefix_cache_hits),
        (
            "vllm:external_prefix_cache_queries",
            "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens.",
            |s| s.external_prefix_cache_queries,
        ),
        (
            "vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens.",
            |s| s.external_prefix_cache_hits,
        ),
        ("vllm:prompt_tokens", "Number of prefill tokens processed.", |s| s.prompt_tokens),
        ("vllm:generation_tokens", "Number of generation tokens processed.", |s| s.generation_tokens),
        ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", |s| s.preemptions),
        ("vllm:request_success", "Count of successfully processed requests.", |s| s.requests_finished),
        (
            "kvroute_sim_requests_aborted",
            "Requests aborted by their frontend before they finished (client disconnected, Responses cancel).",
            |s| s.requests_aborted,
        ),
        (
            "kvroute_sim_prompt_tokens_first_scheduled",
            "Prompt tokens of requests at their first scheduling (re-scheduling after preemption not counted).",
            |s| s.prompt_tokens_first_scheduled,
        ),
    ];
    for (name, help, value) in counters {
        let _ = write!(out, "# HELP {name}_total {help}\n# TYPE {name}_total counter\n");
        for (l, e) in series() {
            let _ = writeln!(out, "{name}_total{{{l}}} {}.0", value(e.stats()));
        }
    }
    let name = "kvroute_sim_cached_tokens_first_scheduled_total";
    let _ = write!(
        out,
        "# HELP {name} Of the prompt tokens at first scheduling, those served from the GPU prefix cache (medium=GPU) or loaded from the CPU offload tier (medium=CPU).\n# TYPE {name} counter\n"
    );
    for (l, e) in series() {
        let st = e.stats();
        let _ = writeln!(out, "{name}{{{l},medium=\"GPU\"}} {}.0", st.cached_tokens_first_scheduled_gpu);
        let _ = writeln!(out, "{name}{{{l},medium=\"CPU\"}} {}.0", st.cached_tokens_first_scheduled_cpu);
    }
    let hists: [Hist; 4] = [
        ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", |s| &s.ttft),
        ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", |s| &s.e2e),
        ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", |s| &s.queue_time),
        ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", |s| &s.prefill_time),
    ];
    for (name, help, hist) in hists {
        let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} histogram\n");
        for (l, e) in series() {
            write_histogram(&mut out, name, l, hist(e.stats()));
        }
    }
    out
}

fn write_histogram(out: &mut String, name: &str, labels: &str, h: &Histogram) {
    let mut cum = 0;
    for (b, c) in h.bounds.iter().zip(&h.counts) {
        cum += c;
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b:?}\"}} {cum}.0");
    }
    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}.0", h.count);
    let _ = writeln!(out, "{name}_count{{{labels}}} {}.0", h.count);
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}", h.sum);
}

/// Parse one sample value out of exposition text (tests and the calibrate example).
pub fn sample(text: &str, name_with_labels_prefix: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.starts_with(name_with_labels_prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{EngineConfig, NewRequest};
    use crate::ids::RequestId;

    #[test]
    fn metrics_agree_with_engine_state() {
        let mut e = Engine::new(EngineConfig { max_num_batched_tokens: 64, ..EngineConfig::default() });
        for id in 0..3 {
            let prompt = (0..100).collect();
            let r = NewRequest { id: RequestId(id), prompt, max_tokens: 3, ignore_eos: true, cache_salt: None, output: Vec::new() };
            e.add_request(r, 0.0).unwrap();
        }
        let mut now = 0.0;
        for _ in 0..3 {
            let out = e.step(now);
            out.tokens.iter().for_each(|t| e.record_output(t));
            now += out.duration_s;
        }
        let text = render(&MetricsInput { model: "m", engines: &[(0, &e)] });
        let l = "{model_name=\"m\",engine=\"0\"}";
        let get = |n: &str| sample(&text, &format!("{n}{l}")).unwrap();
        assert_eq!(get("vllm:num_requests_running"), e.num_running() as f64);
        assert_eq!(get("vllm:num_requests_waiting"), e.num_waiting() as f64);
        assert_eq!(get("vllm:kv_cache_usage_perc"), e.kv_usage());
        assert!(e.kv_usage() > 0.0);
        let st = e.stats();
        assert_eq!(get("vllm:prefix_cache_queries_total"), st.prefix_cache_queries as f64);
        assert_eq!(get("vllm:prefix_cache_hits_total"), st.prefix_cache_hits as f64);
        assert_eq!(get("vllm:generation_tokens_total"), st.generation_tokens as f64);
        assert_eq!(get("vllm:prompt_tokens_total"), st.prompt_tokens as f64);
        assert_eq!(get("kvroute_sim_requests_aborted_total"), st.requests_aborted as f64);
        assert_eq!(get("kvroute_sim_prompt_tokens_first_scheduled_total"), st.prompt_tokens_first_scheduled as f64);
        assert!(st.prompt_tokens_first_scheduled >= 200);
        let cached = |m: &str| sample(&text, &format!("kvroute_sim_cached_tokens_first_scheduled_total{{model_name=\"m\",engine=\"0\",medium=\"{m}\"}}")).unwrap();
        assert_eq!(cached("GPU"), st.cached_tokens_first_scheduled_gpu as f64);
        assert_eq!(cached("CPU"), 0.0);
        assert_eq!(get("vllm:external_prefix_cache_queries_total"), 0.0);
        assert_eq!(get("vllm:time_to_first_token_seconds_count"), st.ttft.count as f64);
        assert!(text.contains("num_gpu_blocks=\"5600\""));
        assert!(text.contains("block_size=\"16\""));
    }
}
