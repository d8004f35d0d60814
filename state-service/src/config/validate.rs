//! Config validation: every error names the field and what is wrong with it.

use super::file::{Config, WorkerConfig, DEFAULT_BLOCK_SIZE};
use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {message}")]
    Read { path: String, message: String },
    #[error("invalid config TOML: {0}")]
    Parse(String),
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { field: field.into(), message: message.into() }
}

impl Config {
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_globals()?;
        let mut ids = BTreeSet::new();
        let mut block_sizes: BTreeMap<&str, u32> = BTreeMap::new();
        for (i, worker) in self.workers.iter().enumerate() {
            let field = format!("workers[{i}] ({})", worker.id);
            self.validate_worker(worker).map_err(|e| prefix(&field, e))?;
            if !ids.insert(worker.id.as_str()) {
                return Err(invalid(field, "duplicate worker id"));
            }
            let size = self.worker_block_size(worker);
            if let Some(prev) = block_sizes.insert(&worker.model, size) {
                if prev != size {
                    return Err(invalid(field, format!("block_size {size} differs from {prev} of another worker of model {}", worker.model)));
                }
            }
        }
        self.validate_groups()
    }

    fn validate_groups(&self) -> Result<(), ConfigError> {
        let mut names = BTreeSet::new();
        for (i, group) in self.worker_groups.iter().enumerate() {
            let field = |name: &str| format!("worker_groups[{i}] ({}).{name}", group.name);
            if let Some((name, message)) = group.problem() {
                return Err(invalid(field(name), message));
            }
            if !names.insert(group.name.as_str()) {
                return Err(invalid(field("name"), "duplicate group name"));
            }
            // The template on its own (a file's entries may name the model).
            if !group.template.model.is_empty() {
                let sample = WorkerConfig { id: format!("{}@template", group.name), ..group.template.clone() };
                self.validate_worker(&sample).map_err(|e| prefix(&field("template"), e))?;
            }
        }
        Ok(())
    }

    fn validate_globals(&self) -> Result<(), ConfigError> {
        const MIN_API_TOKEN_LEN: usize = 32;
        let t = &self.timeouts;
        for (name, v) in [
            ("timeouts.scrape_interval_ms", t.scrape_interval_ms),
            ("timeouts.scrape_timeout_ms", t.scrape_timeout_ms),
            ("timeouts.assignment_ttl_ms", t.assignment_ttl_ms),
            ("timeouts.first_token_ttl_ms", t.first_token_ttl_ms),
            ("timeouts.speculative_ttl_ms", t.speculative_ttl_ms),
            ("timeouts.staleness_ms", t.staleness_ms),
            ("timeouts.header_read_ms", t.header_read_ms),
        ] {
            if v == 0 {
                return Err(invalid(name, "must be > 0"));
            }
        }
        if let Some(problem) = self.scheduling.problems().into_iter().next() {
            return Err(invalid("scheduling", problem));
        }
        if let Some(problem) = crate::pools::problems(&self.pools).into_iter().next() {
            return Err(invalid("pools", problem));
        }
        if t.first_token_ttl_ms > t.assignment_ttl_ms {
            return Err(invalid("timeouts.first_token_ttl_ms", "must not exceed assignment_ttl_ms"));
        }
        if self.text_chunk_bytes == 0 {
            return Err(invalid("text_chunk_bytes", "must be > 0"));
        }
        if !(0.0..=1.0).contains(&self.affinity_tolerance) {
            return Err(invalid("affinity_tolerance", "must be between 0 and 1"));
        }
        if !(0.0..=10.0).contains(&self.queue_externality) {
            return Err(invalid("queue_externality", "must be between 0 and 10"));
        }
        if self.unhealthy_after == 0 {
            return Err(invalid("unhealthy_after", "must be > 0"));
        }
        if let Some(p) = self.allowed_targets.iter().find(|p| !kvroute_core::targets::valid_pattern(p)) {
            return Err(invalid("allowed_targets", format!("{p:?} is not a target pattern")));
        }
        let r = &self.resilience;
        if r.max_concurrent_picks == 0 {
            return Err(invalid("resilience.max_concurrent_picks", "must be > 0"));
        }
        if r.max_assignments == 0 {
            return Err(invalid("resilience.max_assignments", "must be > 0"));
        }
        if !(r.index_capacity_factor == 0.0 || (1.0..=100.0).contains(&r.index_capacity_factor)) {
            return Err(invalid("resilience.index_capacity_factor", "must be 0 (no bound) or between 1 and 100"));
        }
        if r.drain_timeout_ms == 0 {
            return Err(invalid("resilience.drain_timeout_ms", "must be > 0"));
        }
        if matches!(&self.admin_token, Some(t) if t.is_empty()) {
            return Err(invalid("admin_token", "must not be empty (omit it to disable the admin API)"));
        }
        if matches!(&self.api_token, Some(t) if t.len() < MIN_API_TOKEN_LEN || !t.bytes().all(|b| b.is_ascii_graphic())) {
            return Err(invalid("api_token", "must be at least 32 printable characters (the filter's state_token)"));
        }
        if self.api_token.is_some() && self.api_token_file.is_some() {
            return Err(invalid("api_token_file", "set api_token or api_token_file, not both"));
        }
        if self.admin_token.is_some() && self.admin_token_file.is_some() {
            return Err(invalid("admin_token_file", "set admin_token or admin_token_file, not both"));
        }
        self.tenancy.validate().map_err(|(field, message)| invalid(field, message))?;
        for (name, v) in [("responses.max_entries", self.responses.max_entries as u64), ("responses.ttl_ms", self.responses.ttl_ms), ("responses.store_timeout_ms", self.responses.store_timeout_ms)] {
            if v == 0 {
                return Err(invalid(name, "must be > 0"));
            }
        }
        if self.tenancy.has_budgets() && self.api_token.is_none() && self.api_token_file.is_none() {
            return Err(invalid(
                "tenancy.budgets",
                "budgets need api_token (or api_token_file / KVROUTE_API_TOKEN): the service trusts a tenant only from an authenticated proxy",
            ));
        }
        let p = &self.priors;
        check_cost("priors.per_token_ms", p.per_token_ms)?;
        check_cost("priors.overhead_ms", p.overhead_ms)?;
        check_cost("priors.decode_ms_per_running", p.decode_ms_per_running)?;
        if p.max_num_batched_tokens == 0 {
            return Err(invalid("priors.max_num_batched_tokens", "must be > 0"));
        }
        for (model, m) in &self.models {
            if m.block_size == Some(0) {
                return Err(invalid(format!("models.{model}.block_size"), "must be > 0"));
            }
            if m.tokenizer_dir.as_ref().is_some_and(|d| d.as_os_str().is_empty()) {
                return Err(invalid(format!("models.{model}.tokenizer_dir"), "must not be empty (omit it to use tokenization.default_tokenizer_dir)"));
            }
            if m.max_model_len == Some(0) {
                return Err(invalid(format!("models.{model}.max_model_len"), "must be > 0"));
            }
        }
        if self.default_model.as_deref().is_some_and(str::is_empty) {
            return Err(invalid("default_model", "must not be empty (omit it: the fleet's only model, if it has one)"));
        }
        self.validate_tokenization()
    }

    fn validate_tokenization(&self) -> Result<(), ConfigError> {
        let t = &self.tokenization;
        if t.default_tokenizer_dir.as_ref().is_some_and(|d| d.as_os_str().is_empty()) {
            return Err(invalid("tokenization.default_tokenizer_dir", "must not be empty (omit it for no default tokenizer)"));
        }
        if t.cache_bytes == 0 {
            return Err(invalid("tokenization.cache_bytes", "must be > 0"));
        }
        if t.worker_timeout_ms == 0 {
            return Err(invalid("tokenization.worker_timeout_ms", "must be > 0 (set worker_fallback = false to disable the worker path)"));
        }
        Ok(())
    }

    /// Checks one worker on its own (also used by the registration API).
    pub fn validate_worker(&self, w: &WorkerConfig) -> Result<(), ConfigError> {
        if w.id.is_empty() || w.id.contains(['/', ' ', '?', '#']) {
            return Err(invalid("id", "must be non-empty without '/', '?', '#' or spaces"));
        }
        if w.model.is_empty() {
            return Err(invalid("model", "must be non-empty"));
        }
        if !w.endpoint.is_empty() && !is_host_port(&w.endpoint) {
            return Err(invalid("endpoint", format!("{:?} is not host:port", w.endpoint)));
        }
        for (name, target) in [("endpoint", &w.endpoint), ("cluster", &w.cluster)] {
            if !target.is_empty() && !kvroute_core::targets::allowed(&self.allowed_targets, target) {
                return Err(invalid(name, format!("{target:?} is outside allowed_targets")));
            }
        }
        if !(1..=256).contains(&w.dp_ranks) {
            return Err(invalid("dp_ranks", "must be in 1..=256"));
        }
        for (name, ep) in [("events_endpoint", &w.events_endpoint), ("replay_endpoint", &w.replay_endpoint)] {
            if let Some(ep) = ep {
                check_zmq(name, ep, w.dp_ranks)?;
            }
        }
        if let Some(url) = &w.metrics_url {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(invalid("metrics_url", format!("{url:?} is not an http(s) URL")));
            }
        }
        if w.block_size == Some(0) {
            return Err(invalid("block_size", "must be > 0"));
        }
        let model_size = self.models.get(&w.model).and_then(|m| m.block_size);
        if let (Some(own), Some(model)) = (w.block_size, model_size) {
            if own != model {
                return Err(invalid("block_size", format!("{own} differs from models.{}.block_size = {model}", w.model)));
            }
        }
        if let Some(bad) = w.lora_adapters.iter().find(|a| a.is_empty() || **a == w.model) {
            return Err(invalid("lora_adapters", format!("{bad:?}: an adapter needs its own non-empty name, not the base model's")));
        }
        if w.max_num_batched_tokens == Some(0) {
            return Err(invalid("max_num_batched_tokens", "must be > 0"));
        }
        check_cost("per_token_ms", w.per_token_ms.unwrap_or(0.0))?;
        check_cost("reload_ms_per_token", w.reload_ms_per_token.unwrap_or(0.0))?;
        check_cost("overhead_ms", w.overhead_ms.unwrap_or(0.0))
    }

    /// The worker's block size: its own, else its model's, else vLLM's default.
    pub fn worker_block_size(&self, w: &WorkerConfig) -> u32 {
        w.block_size
            .or_else(|| self.models.get(&w.model).and_then(|m| m.block_size))
            .unwrap_or(DEFAULT_BLOCK_SIZE)
    }
}

fn prefix(field: &str, e: ConfigError) -> ConfigError {
    match e {
        ConfigError::Invalid { field: f, message } => invalid(format!("{field}.{f}"), message),
        other => other,
    }
}

fn check_cost(field: &str, v: f64) -> Result<(), ConfigError> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(invalid(field, "must be a finite number >= 0"))
    }
}

fn is_host_port(s: &str) -> bool {
    matches!(s.rsplit_once(':'), Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok())
}

fn check_zmq(field: &str, ep: &str, dp_ranks: u32) -> Result<(), ConfigError> {
    if let Some(rest) = ep.strip_prefix("tcp://") {
        if WorkerConfig::rank_endpoint(rest, dp_ranks - 1).is_none() {
            return Err(invalid(field, format!("{ep:?}: needs a port with room for {dp_ranks} ranks")));
        }
        return Ok(());
    }
    if ep.starts_with("ipc://") || ep.starts_with("inproc://") {
        if dp_ranks > 1 {
            return Err(invalid(field, "ipc/inproc endpoints cannot be offset per data-parallel rank"));
        }
        return Ok(());
    }
    Err(invalid(field, format!("{ep:?} must start with tcp://, ipc:// or inproc://")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("../../examples/kvroute-state.toml");

    #[test]
    fn example_config_is_valid() {
        let c = Config::from_toml(EXAMPLE).expect("example config");
        assert!(!c.workers.is_empty());
    }

    #[test]
    fn scheduling_names_only_configured_classes() {
        let c = Config::from_toml(EXAMPLE).expect("example config");
        assert_eq!(c.scheduling, crate::sched::SchedulingConfig::default(), "the example shows the defaults");
        let bad = "[scheduling]\ndefault_class = \"gold\"\n";
        assert!(Config::from_toml(bad).unwrap_err().to_string().contains("scheduling"));
        let bad = "[scheduling.tenants.a]\nclass = \"gold\"\n";
        assert!(Config::from_toml(bad).unwrap_err().to_string().contains("gold"));
        let bad = "[scheduling.tenants.a]\nweight = 0\n";
        assert!(Config::from_toml(bad).is_err());
        let ok = "[scheduling]\nenabled = true\ndefault_class = \"x\"\n[scheduling.classes.x]\nqueue_deadline_ms = 100\n[scheduling.tenants.a]\nclass = \"x\"\n";
        let c = Config::from_toml(ok).expect("a class of its own");
        assert_eq!(c.scheduling.class_of("", "a"), "x");
        assert_eq!(c.scheduling.class_of("nope", "b"), "x");
    }

    #[test]
    fn errors_name_the_field() {
        let bad = "[[workers]]\nid = \"a\"\nmodel = \"m\"\nendpoint = \"nohostport\"\n";
        let err = Config::from_toml(bad).unwrap_err().to_string();
        assert!(err.contains("workers[0] (a).endpoint"), "{err}");
        let dup = "[[workers]]\nid = \"a\"\nmodel = \"m\"\n[[workers]]\nid = \"a\"\nmodel = \"m\"\n";
        assert!(Config::from_toml(dup).unwrap_err().to_string().contains("duplicate"));
        let unknown = "listen = \"127.0.0.1:1\"\nbogus = 1\n";
        assert!(matches!(Config::from_toml(unknown), Err(ConfigError::Parse(_))));
    }

    #[test]
    fn workers_outside_allowed_targets_are_refused() {
        let text = "allowed_targets = [\"10.1.0.*:8000\", \"vllm_*\"]\n[[workers]]\nid = \"a\"\nmodel = \"m\"\nendpoint = \"10.1.0.7:8000\"\ncluster = \"vllm_a\"\n";
        let c = Config::from_toml(text).expect("inside the allowlist");
        let outside = WorkerConfig { endpoint: "169.254.169.254:80".into(), ..WorkerConfig::new("b", "m") };
        assert!(c.validate_worker(&outside).unwrap_err().to_string().contains("outside allowed_targets"), "what Redis adoption checks too");
        let bad_cluster = WorkerConfig { endpoint: "10.1.0.8:8000".into(), cluster: "kvroute_state".into(), ..WorkerConfig::new("c", "m") };
        assert!(c.validate_worker(&bad_cluster).is_err());
        assert!(Config::from_toml("allowed_targets = [\"a b\"]\n").is_err());
    }

    #[test]
    fn block_sizes_must_agree_per_model() {
        let text = "[[workers]]\nid = \"a\"\nmodel = \"m\"\nblock_size = 16\n[[workers]]\nid = \"b\"\nmodel = \"m\"\nblock_size = 32\n";
        assert!(Config::from_toml(text).unwrap_err().to_string().contains("differs"));
    }

    #[test]
    fn tokenizer_settings_are_checked_but_a_missing_dir_is_not_an_error() {
        let empty = "[models.\"m\"]\ntokenizer_dir = \"\"\n";
        assert!(Config::from_toml(empty).unwrap_err().to_string().contains("models.m.tokenizer_dir: must not be empty"));
        let zero = "[tokenization]\nworker_timeout_ms = 0\n";
        assert!(Config::from_toml(zero).unwrap_err().to_string().starts_with("tokenization.worker_timeout_ms"));
        let missing = "[tokenization]\ndefault_tokenizer_dir = \"/nonexistent\"\n[models.\"m\"]\ntokenizer_dir = \"/also/missing\"\n";
        let c = Config::from_toml(missing).expect("a missing dir degrades at run time, it is not a config error");
        assert_eq!(c.tokenizer_dir("m"), Some(std::path::Path::new("/also/missing")));
        assert_eq!(c.tokenizer_dir("other"), Some(std::path::Path::new("/nonexistent")));
    }

    #[test]
    fn worker_groups_name_one_source_and_derive_what_a_worker_is() {
        let ok = "[[worker_groups]]\nname = \"vllm\"\ndns = \"vllm.ns.svc\"\nport = 8000\nevents_port = 5557\n[worker_groups.template]\nmodel = \"m\"\n";
        let c = Config::from_toml(ok).expect("a dns group");
        let w = c.worker_groups[0].worker_at("[fd00::5]", 8000);
        assert_eq!((w.id.as_str(), w.endpoint.as_str()), ("vllm@[fd00::5]:8000", "[fd00::5]:8000"));
        assert_eq!(w.events_endpoint.as_deref(), Some("tcp://[fd00::5]:5557"));
        c.validate_worker(&w).expect("a derived worker is valid");
        let bad = [
            ("[[worker_groups]]\nname = \"g\"\n[worker_groups.template]\nmodel = \"m\"\n", "exactly one"),
            ("[[worker_groups]]\nname = \"g\"\ndns = \"a\"\nsrv = \"b\"\nport = 1\n[worker_groups.template]\nmodel = \"m\"\n", "exactly one"),
            ("[[worker_groups]]\nname = \"g\"\ndns = \"a\"\n[worker_groups.template]\nmodel = \"m\"\n", "port"),
            ("[[worker_groups]]\nname = \"g\"\nsrv = \"a\"\n[worker_groups.template]\n", "template.model"),
            ("[[worker_groups]]\nname = \"g@\"\nsrv = \"a\"\n[worker_groups.template]\nmodel = \"m\"\n", "name"),
            ("[[worker_groups]]\nname = \"g\"\nsrv = \"a\"\n[worker_groups.template]\nmodel = \"m\"\nendpoint = \"h:1\"\n", "come from the group"),
            ("[[worker_groups]]\nname = \"g\"\nsrv = \"a\"\nmin_refresh_ms = 5000\nmax_refresh_ms = 10\n[worker_groups.template]\nmodel = \"m\"\n", "min_refresh_ms"),
            ("[[worker_groups]]\nname = \"g\"\nsrv = \"a\"\n[worker_groups.template]\nmodel = \"m\"\ndp_ranks = 0\n", "template"),
        ];
        for (text, field) in bad {
            let err = Config::from_toml(text).unwrap_err().to_string();
            assert!(err.contains(field), "{text}: {err}");
        }
        let twice = format!("{ok}{ok}");
        assert!(Config::from_toml(&twice).unwrap_err().to_string().contains("duplicate group"));
    }

    #[test]
    fn rank_endpoints_offset_the_port() {
        assert_eq!(WorkerConfig::rank_endpoint("tcp://h:5557", 2).as_deref(), Some("tcp://h:5559"));
        assert!(WorkerConfig::rank_endpoint("tcp://h:65535", 1).is_none());
        let ranks = "[[workers]]\nid = \"a\"\nmodel = \"m\"\ndp_ranks = 2\nevents_endpoint = \"ipc:///tmp/x\"\n";
        assert!(Config::from_toml(ranks).is_err());
    }
}
