//! The state service's own tokenizers, one per model, loaded from the configured directory.
//!
//! A model's tokenizer is loaded at most once, on the blocking pool: eagerly at start-up
//! (`/readyz` waits for it), or in the background after the first pick that needs it. A pick
//! never waits for a load (a Qwen-sized `tokenizer.json` takes ~0.1-1 s): until it is done
//! the pick uses the next path, counted as `loading`. A missing or broken directory is not
//! fatal: it is logged once, counted, shown in `/v1/models`, and that model's picks use the
//! next tokenization path. Loading is not retried: fixing the files needs a restart, which is
//! also when vLLM itself would pick up a new tokenizer.

use kvroute_tokenize::{CacheStats, ModelTokenizer, TokenizerOptions};
use parking_lot::RwLock;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// The outcome of loading one model's tokenizer.
type Loaded = Result<Arc<ModelTokenizer>, String>;

struct Slot {
    dir: Option<PathBuf>,
    started: AtomicBool,
    loaded: OnceLock<Loaded>,
}

/// What a pick can get right now without blocking.
pub enum Lookup {
    Ready(Arc<ModelTokenizer>),
    /// Configured, not loaded, no load started: [`LocalTokenizers::claim`] one.
    NeedsLoad,
    /// A load is under way.
    Loading,
    /// Not configured, or loading failed.
    Unavailable,
}

/// A model's tokenizer as `/v1/models` and the metrics show it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TokenizerStatus {
    /// `loaded`, `failed`, `not_loaded` (configured, not yet needed) or `not_configured`.
    pub status: &'static str,
    pub dir: Option<String>,
    pub error: Option<String>,
    pub cache: Option<CacheStats>,
}

pub struct LocalTokenizers {
    models: RwLock<HashMap<String, Arc<Slot>>>,
    /// Directories by model, as configured (own `tokenizer_dir`, else the default).
    dirs: BTreeMap<String, PathBuf>,
    default_dir: Option<PathBuf>,
    cache_bytes: usize,
    load_failures: AtomicU64,
    /// Loads started and not finished.
    loading: AtomicUsize,
}

impl LocalTokenizers {
    pub fn new(config: &crate::config::Config) -> LocalTokenizers {
        let dirs = config.models.iter().filter_map(|(m, c)| c.tokenizer_dir.clone().map(|d| (m.clone(), d))).collect();
        LocalTokenizers {
            models: RwLock::new(HashMap::new()),
            dirs,
            default_dir: config.tokenization.default_tokenizer_dir.clone(),
            cache_bytes: config.tokenization.cache_bytes,
            load_failures: AtomicU64::new(0),
            loading: AtomicUsize::new(0),
        }
    }

    fn slot(&self, model: &str) -> Arc<Slot> {
        if let Some(slot) = self.models.read().get(model) {
            return slot.clone();
        }
        let dir = self.dirs.get(model).cloned().or_else(|| self.default_dir.clone());
        let slot = Arc::new(Slot { dir, started: AtomicBool::new(false), loaded: OnceLock::new() });
        self.models.write().entry(model.to_string()).or_insert(slot).clone()
    }

    pub fn lookup(&self, model: &str) -> Lookup {
        let slot = self.slot(model);
        match (&slot.dir, slot.loaded.get()) {
            (None, _) | (_, Some(Err(_))) => Lookup::Unavailable,
            (Some(_), Some(Ok(t))) => Lookup::Ready(t.clone()),
            (Some(_), None) if slot.started.load(Ordering::Acquire) => Lookup::Loading,
            (Some(_), None) => Lookup::NeedsLoad,
        }
    }

    /// Claims `model`'s load: true (and counted as loading) for exactly one caller when a
    /// directory is configured; that caller must then run [`Self::finish_load`].
    pub fn claim(&self, model: &str) -> bool {
        let slot = self.slot(model);
        if slot.dir.is_none() || slot.started.swap(true, Ordering::AcqRel) {
            return false;
        }
        self.loading.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// Reads a claimed model's files. Blocks (~0.1-1 s): run it on the blocking pool.
    pub fn finish_load(&self, model: &str) {
        let slot = self.slot(model);
        if let Some(dir) = &slot.dir {
            slot.loaded.get_or_init(|| self.read(model, dir));
        }
        self.loading.fetch_sub(1, Ordering::AcqRel);
    }

    /// Loads `model`'s tokenizer now, or waits for a load under way (blocking; tests).
    pub fn load(&self, model: &str) -> Option<Arc<ModelTokenizer>> {
        if self.claim(model) {
            self.finish_load(model);
        }
        let slot = self.slot(model);
        let dir = slot.dir.as_ref()?;
        slot.loaded.get_or_init(|| self.read(model, dir)).as_ref().ok().cloned()
    }

    /// Whether a load is under way (`/readyz` answers 503 meanwhile).
    pub fn loading(&self) -> bool {
        self.loading.load(Ordering::Acquire) > 0
    }

    fn read(&self, model: &str, dir: &std::path::Path) -> Loaded {
        let options = TokenizerOptions { cache_bytes: self.cache_bytes, ..Default::default() };
        match ModelTokenizer::from_dir_with(dir, options) {
            Ok(t) => {
                tracing::info!(model, dir = %dir.display(), "tokenizer loaded");
                Ok(Arc::new(t))
            }
            Err(e) => {
                self.load_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(model, dir = %dir.display(), error = %e,
                    "cannot load tokenizer: chat/text picks of this model use the worker's /tokenize or text chunks");
                Err(e.to_string())
            }
        }
    }

    pub fn load_failures(&self) -> u64 {
        self.load_failures.load(Ordering::Relaxed)
    }

    /// Every model seen so far or configured, with its status.
    pub fn statuses(&self, also: impl IntoIterator<Item = String>) -> BTreeMap<String, TokenizerStatus> {
        let mut names: Vec<String> = self.dirs.keys().cloned().chain(self.models.read().keys().cloned()).chain(also).collect();
        names.sort();
        names.dedup();
        names.into_iter().map(|m| {
            let status = self.status(&m);
            (m, status)
        }).collect()
    }

    pub fn status(&self, model: &str) -> TokenizerStatus {
        let slot = self.slot(model);
        let dir = slot.dir.as_ref().map(|d| d.display().to_string());
        let (status, error, cache) = match (&slot.dir, slot.loaded.get()) {
            (None, _) => ("not_configured", None, None),
            (Some(_), None) => ("not_loaded", None, None),
            (Some(_), Some(Ok(t))) => ("loaded", None, Some(t.cache_stats())),
            (Some(_), Some(Err(e))) => ("failed", Some(e.clone()), None),
        };
        TokenizerStatus { status, dir, error, cache }
    }
}
