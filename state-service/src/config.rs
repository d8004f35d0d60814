//! Service configuration: a TOML file, overridable by CLI flags and environment variables.
//!
//! The file is the source of truth for the fleet (workers, models, timeouts); the few flags a
//! benchmark or a container wants to change without editing it (listen address, policy, admin
//! token) override it. Everything is validated once at start-up, and again for every worker
//! registered at runtime, so the rest of the service can trust what it reads here.

mod cli;
mod file;
pub mod groups;
pub mod store;
mod validate;

pub use cli::Cli;
pub use store::{RedisConfig, StoreKind};
pub use file::{Config, ModelConfig, Priors, Resilience, Timeouts, Tokenization, WorkerConfig};
pub use validate::ConfigError;

use kvroute_score::Policy;
use std::path::Path;

impl Config {
    /// Parses TOML text and validates it.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// Reads, parses and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::Read { path: path.display().to_string(), message: e.to_string() })?;
        let mut config = Config::from_toml(&text)?;
        config.read_token_files()?;
        config.validate()?;
        Ok(config)
    }

    /// Loads the file named by `cli` and applies its overrides and the environment's
    /// credentials, then validates the result once (a file that needs a credential the
    /// environment supplies is valid).
    pub fn from_cli(cli: &Cli) -> Result<Config, ConfigError> {
        Config::from_cli_env(cli, |name| std::env::var(name).ok())
    }

    /// [`Config::from_cli`] reading the environment through `env`.
    pub fn from_cli_env(cli: &Cli, env: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let mut config = match &cli.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| ConfigError::Read { path: path.display().to_string(), message: e.to_string() })?;
                toml::from_str(&text).map_err(|e| ConfigError::Parse(e.to_string()))?
            }
            None => Config::default(),
        };
        if let Some(listen) = cli.listen {
            config.listen = listen;
        }
        if let Some(policy) = cli.policy {
            config.policy = policy;
        }
        if let Some(t) = cli.affinity_tolerance {
            config.affinity_tolerance = t;
        }
        if let Some(w) = cli.queue_externality {
            config.queue_externality = w;
        }
        // Credentials come from the environment or files, never argv (visible to every user).
        if let Some(token) = env("KVROUTE_ADMIN_TOKEN") {
            config.admin_token = Some(token);
            config.admin_token_file = None;
        }
        if let Some(token) = env("KVROUTE_API_TOKEN") {
            config.api_token = Some(token);
            config.api_token_file = None;
        }
        config.read_token_files()?;
        if let Some(dir) = &cli.tokenizer_dir {
            config.tokenization.default_tokenizer_dir = Some(dir.clone());
        }
        config.validate()?;
        Ok(config)
    }

    /// Replaces `api_token_file` / `admin_token_file` by the tokens they hold.
    pub fn read_token_files(&mut self) -> Result<(), ConfigError> {
        let read = |path: &Path| {
            std::fs::read_to_string(path)
                .map(|t| t.trim().to_string())
                .map_err(|e| ConfigError::Read { path: path.display().to_string(), message: e.to_string() })
        };
        if let Some(path) = self.api_token_file.take() {
            self.api_token = Some(read(&path)?);
        }
        if let Some(path) = self.admin_token_file.take() {
            self.admin_token = Some(read(&path)?);
        }
        Ok(())
    }

    /// The block size kvroute keys of `model` are cut with.
    pub fn block_size(&self, model: &str) -> u32 {
        self.models.get(model).and_then(|m| m.block_size).unwrap_or(file::DEFAULT_BLOCK_SIZE)
    }

    /// Where `model`'s tokenizer files are: its own `tokenizer_dir`, else the default.
    pub fn tokenizer_dir(&self, model: &str) -> Option<&Path> {
        self.models
            .get(model)
            .and_then(|m| m.tokenizer_dir.as_deref())
            .or(self.tokenization.default_tokenizer_dir.as_deref())
    }

    /// The policy in force at start-up.
    pub fn initial_policy(&self) -> Policy {
        self.policy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_the_defaults_and_are_validated() {
        let cli = Cli { policy: Some(Policy::RoundRobin), affinity_tolerance: Some(0.1), ..Cli::default() };
        let c = Config::from_cli(&cli).unwrap();
        assert_eq!((c.policy, c.affinity_tolerance), (Policy::RoundRobin, 0.1));
        let bad = Cli { affinity_tolerance: Some(1.5), ..Cli::default() };
        assert!(Config::from_cli(&bad).unwrap_err().to_string().contains("affinity_tolerance"));
    }

    /// Budgets need the API token; the README says it may come from the environment only.
    #[test]
    fn budgets_start_with_the_token_from_the_environment() {
        let path = std::env::temp_dir().join(format!("kvroute-budgets-{}.toml", std::process::id()));
        std::fs::write(&path, "[tenancy.budgets.team]\ntokens_per_minute = 100\n").unwrap();
        let cli = Cli { config: Some(path.clone()), ..Cli::default() };
        let token = "t".repeat(40);
        let with = Config::from_cli_env(&cli, |k| (k == "KVROUTE_API_TOKEN").then(|| token.clone()));
        let without = Config::from_cli_env(&cli, |_| None);
        let _ = std::fs::remove_file(&path);
        assert_eq!(with.expect("the environment's token counts").api_token.as_deref(), Some(token.as_str()));
        assert!(without.unwrap_err().to_string().contains("api_token"), "still refused without any token");
    }
}
