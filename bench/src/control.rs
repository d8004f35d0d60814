//! The stack's control surface, as the benchmark uses it between passes: switch the state
//! service's policy and reset it, empty every worker's prefix cache, read the workers'
//! prefix-cache counters and the state service's degraded-decision counters.
//!
//! Prometheus text is parsed with a deliberately small reader (name, labels, value) that
//! sums a family over all its label sets; it only has to read what the sim and the state
//! service emit.

use crate::report::CacheDelta;
use crate::BenchError;
use std::time::{Duration, Instant};

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

    /// The state service's degraded / fallback decision counters, summed; `None` when it
    /// exposes none (then the response headers are the only source).
    pub async fn state_degraded(&self) -> Option<f64> {
        let text = self.get_text(&format!("{}/metrics", self.state_url)).await.ok()?;
        sum_counters_matching(&text, &["degraded", "fallback"])
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
    fn sums_families_over_labels() {
        assert_eq!(sum_metric(TEXT, "vllm:prefix_cache_hits_total"), Some(150.0));
        assert_eq!(sum_metric(TEXT, "vllm:prefix_cache_queries_total"), Some(400.0));
        assert_eq!(sum_metric(TEXT, "vllm:missing"), None);
        assert_eq!(sum_counters_matching(TEXT, &["degraded", "fallback"]), Some(3.0));
    }
}
