//! The stack's control surface, as the benchmark uses it between passes: switch the state
//! service's policy and reset it, empty every worker's prefix cache, read the workers'
//! prefix-cache counters and the state service's degraded-decision counters.
//!
//! Prometheus text is parsed with a deliberately small reader (name, labels, value) that
//! sums a family over all its label sets, or over those with one label value; it only has
//! to read what the sim and the state service emit.
//!
//! First-scheduling reuse comes from the sims' `kvroute_sim_prompt_tokens_first_scheduled_total`
//! and `kvroute_sim_cached_tokens_first_scheduled_total{medium="GPU"|"CPU"}`: tokens counted
//! once per request, when it is first scheduled (vLLM's own prefix-cache counters count every
//! admission, so a preempted request's re-admission hits its own blocks again). Workers that
//! lack them make the figure `None` ("n/a"), never an error.

use crate::counters::{Buckets, CacheDelta, FirstScheduled};
use crate::BenchError;
use std::time::{Duration, Instant};

pub const FIRST_SCHEDULED_PROMPT: &str = "kvroute_sim_prompt_tokens_first_scheduled_total";
pub const FIRST_SCHEDULED_CACHED: &str = "kvroute_sim_cached_tokens_first_scheduled_total";

/// One sample line of the exposition format: the state service's parser, so the bench reads
/// the workers' metrics exactly as the router does.
pub use kvroute_state::load::parse::Sample as Series;

/// Every sample of `text` that parses.
pub fn parse_series(text: &str) -> Vec<Series> {
    kvroute_state::load::parse::samples(text).collect()
}

/// Sum of the samples of `name` whose label `key` is `value`; `None` when there are none.
pub fn sum_metric_where(text: &str, name: &str, key: &str, value: &str) -> Option<f64> {
    parse_series(text)
        .into_iter()
        .filter(|s| s.name == name && s.label(key) == Some(value))
        .fold(None, |acc, s| Some(acc.unwrap_or(0.0) + s.value))
}

/// A histogram family's cumulative buckets, summed over its label sets; `None` without any.
pub fn histogram(text: &str, name: &str) -> Option<Buckets> {
    histogram_where(text, name, None)
}

/// [`histogram`] over the label sets whose label `key` is `value` (`where_`).
pub fn histogram_where(text: &str, name: &str, where_: Option<(&str, &str)>) -> Option<Buckets> {
    let bucket = format!("{name}_bucket");
    let mut by_le: Vec<(f64, f64)> = Vec::new();
    let wanted = |s: &Series| s.name == bucket && where_.is_none_or(|(k, v)| s.label(k) == Some(v));
    for s in parse_series(text).into_iter().filter(wanted) {
        let le = match s.label("le") {
            Some("+Inf") => f64::INFINITY,
            Some(v) => v.parse().ok()?,
            None => continue,
        };
        match by_le.iter_mut().find(|(l, _)| *l == le) {
            Some(entry) => entry.1 += s.value,
            None => by_le.push((le, s.value)),
        }
    }
    by_le.sort_by(|a, b| a.0.total_cmp(&b.0));
    (!by_le.is_empty()).then_some(Buckets(by_le))
}

/// One worker's first-scheduling counters; `None` when it lacks the prompt counter.
pub fn first_scheduled_of(text: &str) -> Option<FirstScheduled> {
    Some(FirstScheduled {
        prompt_tokens: parse_series(text)
            .into_iter()
            .filter(|s| s.name == FIRST_SCHEDULED_PROMPT)
            .fold(None, |acc, s| Some(acc.unwrap_or(0.0) + s.value))?,
        cached_gpu: sum_metric_where(text, FIRST_SCHEDULED_CACHED, "medium", "GPU"),
        cached_cpu: sum_metric_where(text, FIRST_SCHEDULED_CACHED, "medium", "CPU"),
    })
}

/// The fleet's counters: every worker must have each one, else that one is `None`.
pub fn first_scheduled_total(per_worker: &[Option<FirstScheduled>]) -> Option<FirstScheduled> {
    let all: Vec<FirstScheduled> = per_worker.iter().copied().collect::<Option<_>>()?;
    if all.is_empty() {
        return None;
    }
    let sum = |f: fn(&FirstScheduled) -> Option<f64>| all.iter().map(f).sum::<Option<f64>>();
    Some(FirstScheduled {
        prompt_tokens: all.iter().map(|w| w.prompt_tokens).sum(),
        cached_gpu: sum(|w| w.cached_gpu),
        cached_cpu: sum(|w| w.cached_cpu),
    })
}

/// Sum of every sample of metric `name` (exact name, any labels) in exposition `text`.
pub fn sum_metric(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = match line.rsplit_once(' ') {
            Some(p) => p,
            None => continue,
        };
        let metric = series.split('{').next().unwrap_or("").trim();
        if metric == name {
            if let Ok(v) = value.trim().parse::<f64>() {
                *found.get_or_insert(0.0) += v;
            }
        }
    }
    found
}

/// Sum over all series whose name contains any of `needles` and ends with `_total`
/// (counters only), e.g. the state service's fallback / degraded counters.
pub fn sum_counters_matching(text: &str, needles: &[&str]) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        let metric = series.split('{').next().unwrap_or("");
        if metric.ends_with("_total") && needles.iter().any(|n| metric.contains(n)) {
            if let Ok(v) = value.trim().parse::<f64>() {
                *found.get_or_insert(0.0) += v;
            }
        }
    }
    found
}

#[derive(Clone, Debug)]
pub struct Control {
    client: reqwest::Client,
    /// State service base URL, e.g. `http://127.0.0.1:9000`.
    pub state_url: String,
    pub admin_token: Option<String>,
    /// Simulated workers' base URLs (their admin and metrics endpoints).
    pub workers: Vec<String>,
}

impl Control {
    pub fn new(state_url: String, admin_token: Option<String>, workers: Vec<String>) -> Result<Control, BenchError> {
        for u in workers.iter().chain([&state_url]) {
            crate::target::ensure_loopback(u)?;
        }
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| BenchError::http(&state_url, e))?;
        Ok(Control { client, state_url, admin_token, workers })
    }

    async fn post(&self, url: &str, body: serde_json::Value, admin: bool) -> Result<(), BenchError> {
        let mut req = self.client.post(url).json(&body);
        if let (true, Some(t)) = (admin, &self.admin_token) {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.map_err(|e| BenchError::http(url, e))?;
        if resp.status().is_success() {
            return Ok(());
        }
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        Err(BenchError::http(url, format!("{status}: {}", text.chars().take(300).collect::<String>())))
    }

    async fn get_text(&self, url: &str) -> Result<String, BenchError> {
        let resp = self.client.get(url).send().await.map_err(|e| BenchError::http(url, e))?;
        if !resp.status().is_success() {
            return Err(BenchError::http(url, resp.status()));
        }
        resp.text().await.map_err(|e| BenchError::http(url, e))
    }

    pub async fn set_policy(&self, policy: &str) -> Result<(), BenchError> {
        let url = format!("{}/admin/policy", self.state_url);
        self.post(&url, serde_json::json!({ "policy": policy }), true).await
    }

    /// Forget assignments, learned keys, calibration and the index (the workers' caches are
    /// being emptied too, so nothing learned in the previous pass is true any more).
    pub async fn reset_state(&self) -> Result<(), BenchError> {
        let url = format!("{}/admin/reset", self.state_url);
        self.post(&url, serde_json::json!({}), true).await
    }

    pub async fn reset_workers(&self) -> Result<(), BenchError> {
        for w in &self.workers {
            self.post(&format!("{w}/sim/reset_prefix_cache"), serde_json::json!({}), false).await?;
        }
        Ok(())
    }

    /// Absolute prefix-cache counters summed over the workers (subtract two for a delta).
    pub async fn cache_counters(&self) -> Result<CacheDelta, BenchError> {
        let mut total = CacheDelta::default();
        for w in &self.workers {
            let url = format!("{w}/metrics");
            let text = self.get_text(&url).await?;
            let q = sum_metric(&text, "vllm:prefix_cache_queries_total");
            let h = sum_metric(&text, "vllm:prefix_cache_hits_total");
            let (Some(q), Some(h)) = (q, h) else {
                return Err(BenchError::Metrics { url, message: "no vllm:prefix_cache_{queries,hits}_total".into() });
            };
            total.queries += q;
            total.hits += h;
        }
        Ok(total)
    }

    /// Every worker's `/metrics` text; `None` if any cannot be read.
    pub async fn worker_metrics(&self) -> Option<Vec<String>> {
        let mut out = Vec::with_capacity(self.workers.len());
        for w in &self.workers {
            out.push(self.get_text(&format!("{w}/metrics")).await.ok()?);
        }
        Some(out)
    }

    /// The sims' first-scheduling counters summed over the workers (absolute); `None` when
    /// a worker cannot be read or lacks them.
    pub async fn first_scheduled(&self) -> Option<FirstScheduled> {
        let texts = self.worker_metrics().await?;
        let per: Vec<Option<FirstScheduled>> = texts.iter().map(|t| first_scheduled_of(t)).collect();
        first_scheduled_total(&per)
    }

    /// The state service's degraded / fallback decision counters, summed; `None` when it
    /// exposes none (then the response headers are the only source).
    pub async fn state_degraded(&self) -> Option<f64> {
        let text = self.get_text(&format!("{}/metrics", self.state_url)).await.ok()?;
        sum_counters_matching(&text, &["degraded", "fallback"])
    }

    /// The state service's queued-pick outcomes (`kvroute_queue_outcomes_total`) by outcome,
    /// summed over classes and tenants (absolute).
    pub async fn queue_outcomes(&self) -> std::collections::BTreeMap<String, f64> {
        let text = self.get_text(&format!("{}/metrics", self.state_url)).await.unwrap_or_default();
        let mut out = std::collections::BTreeMap::new();
        for s in parse_series(&text).into_iter().filter(|s| s.name == "kvroute_queue_outcomes_total") {
            *out.entry(s.label("outcome").unwrap_or("").to_string()).or_insert(0.0) += s.value;
        }
        out
    }

    /// The state service's queue waits of dispatched picks (`kvroute_queue_wait_seconds`) by
    /// service class (cumulative).
    pub async fn queue_waits(&self) -> std::collections::BTreeMap<String, Buckets> {
        let text = self.get_text(&format!("{}/metrics", self.state_url)).await.unwrap_or_default();
        let name = "kvroute_queue_wait_seconds";
        let classes: std::collections::BTreeSet<String> =
            parse_series(&text).into_iter().filter(|s| s.name == format!("{name}_bucket")).filter_map(|s| s.label("class").map(str::to_string)).collect();
        classes.into_iter().filter_map(|c| histogram_where(&text, name, Some(("class", &c))).map(|b| (c, b))).collect()
    }

    /// The state service's pick answer-time histogram (`kvroute_pick_answer_seconds`),
    /// cumulative; `None` when it exposes none.
    pub async fn pick_answer(&self) -> Option<Buckets> {
        let text = self.get_text(&format!("{}/metrics", self.state_url)).await.ok()?;
        histogram(&text, "kvroute_pick_answer_seconds")
    }

    /// Wait until no worker has requests running or waiting (a pass's stragglers must not
    /// load the next pass), up to `limit`.
    pub async fn wait_idle(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            let mut busy = 0.0;
            for w in &self.workers {
                if let Ok(t) = self.get_text(&format!("{w}/metrics")).await {
                    busy += sum_metric(&t, "vllm:num_requests_running").unwrap_or(0.0);
                    busy += sum_metric(&t, "vllm:num_requests_waiting").unwrap_or(0.0);
                }
            }
            if busy == 0.0 {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP vllm:prefix_cache_hits_total x\n# TYPE vllm:prefix_cache_hits_total counter\n\
        vllm:prefix_cache_hits_total{model_name=\"m\",engine=\"0\"} 120.0\n\
        vllm:prefix_cache_hits_total{model_name=\"m\",engine=\"1\"} 30\n\
        vllm:prefix_cache_queries_total{model_name=\"m\",engine=\"0\"} 400.0\n\
        kvroute_degraded_decisions_total{reason=\"state_unavailable\"} 2\n\
        kvroute_filter_fallback_total 1\nkvroute_fallback_ratio 0.5\n";

    #[test]
    fn histograms_sum_their_label_sets() {
        let text = "kvroute_pick_answer_seconds_bucket{le=\"0.001\"} 2\nkvroute_pick_answer_seconds_bucket{le=\"+Inf\"} 4\n\
                    kvroute_pick_answer_seconds_sum 0.1\nkvroute_pick_answer_seconds_count 4\n";
        assert_eq!(histogram(text, "kvroute_pick_answer_seconds"), Some(Buckets(vec![(0.001, 2.0), (f64::INFINITY, 4.0)])));
        assert_eq!(histogram(text, "missing"), None);
    }

    #[test]
    fn sums_families_over_labels() {
        assert_eq!(sum_metric(TEXT, "vllm:prefix_cache_hits_total"), Some(150.0));
        assert_eq!(sum_metric(TEXT, "vllm:prefix_cache_queries_total"), Some(400.0));
        assert_eq!(sum_metric(TEXT, "vllm:missing"), None);
        assert_eq!(sum_counters_matching(TEXT, &["degraded", "fallback"]), Some(3.0));
    }

    const SIM: &str = "# TYPE kvroute_sim_prompt_tokens_first_scheduled_total counter\n\
        kvroute_sim_prompt_tokens_first_scheduled_total{model_name=\"m\",engine=\"0\"} 1000.0\n\
        kvroute_sim_prompt_tokens_first_scheduled_total{model_name=\"m\",engine=\"1\"} 500\n\
        kvroute_sim_cached_tokens_first_scheduled_total{model_name=\"m\",engine=\"0\",medium=\"GPU\"} 600\n\
        kvroute_sim_cached_tokens_first_scheduled_total{model_name=\"m\",engine=\"1\",medium=\"GPU\"} 100\n\
        kvroute_sim_cached_tokens_first_scheduled_total{model_name=\"m\",engine=\"0\",medium=\"CPU\"} 50 1700000000\n\
        vllm:cache_config_info{block_size=\"16\",name=\"a \\\"q\\\", b}\",num_gpu_blocks=\"5600\"} 1.0\n";

    #[test]
    fn reads_labels_and_first_scheduled_counters() {
        let s = parse_series(SIM);
        assert_eq!(s.len(), 6);
        assert_eq!(s[5].label("name"), Some("a \"q\", b}"));
        assert_eq!(s[5].label("num_gpu_blocks"), Some("5600"));
        assert_eq!(s[4].value, 50.0, "a trailing timestamp is not the value");
        let fs = first_scheduled_of(SIM).unwrap();
        assert_eq!(fs, FirstScheduled { prompt_tokens: 1500.0, cached_gpu: Some(700.0), cached_cpu: Some(50.0) });
        // vLLM-only metrics (no kvroute_sim counters): n/a, not an error.
        assert_eq!(first_scheduled_of(TEXT), None);
        let gpu_only = first_scheduled_of(&SIM.replace("medium=\"CPU\"", "medium=\"DISK\"")).unwrap();
        assert_eq!(gpu_only.cached_cpu, None);
        // Fleet totals: a worker without the counters makes the whole figure n/a.
        assert_eq!(first_scheduled_total(&[Some(fs), None]), None);
        assert_eq!(first_scheduled_total(&[]), None);
        let both = first_scheduled_total(&[Some(fs), Some(gpu_only)]).unwrap();
        assert_eq!(both.prompt_tokens, 3000.0);
        assert_eq!(both.cached_gpu, Some(1400.0));
        assert_eq!(both.cached_cpu, None, "one worker has no CPU series");
    }
}
