//! Tenants and budgets: who a request is charged to, and whether its tenant's budget admits it.
//!
//! The tenant comes only from an authenticated proxy (the filter's verified facts, see
//! architecture.md "Trust and tenancy"); budgets charge what a request really costs the
//! fleet: at the pick, its predicted uncached prompt tokens plus its output reservation; at
//! completion, the response's usage. The ledger ([`ledger`]) is shared by every replica
//! through the Redis store, local with the memory store.

pub mod ledger;
pub mod settle;
pub mod window;

pub use ledger::{Ledger, Limit, Limits, Outcome, Scope, Usage};
pub use settle::{settled_tokens, Ending};

use crate::metrics::{Registry, TenantLabels, TenantTokenLabels};
use kvroute_core::wire::{BudgetLimit, Rejection};
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use window::MemoryLedger;

/// Budgets are per minute: a sliding window of 60 s.
pub const WINDOW_MS: u64 = 60_000;
/// Longest tenant name accepted (a JWT `sub`, a SPIFFE id, a team name).
pub const MAX_TENANT_LEN: usize = 128;
/// Tenants remembered for `GET /v1/tenants` beyond the configured ones (most recent first).
const SEEN_TENANTS: usize = 1024;

/// `[tenancy]`: budgets and how they are enforced.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct TenancyConfig {
    /// Output tokens reserved for a request that sets no output limit. Unset (the default):
    /// what the engine may generate, up to the model's context length
    /// (`[models.X].max_model_len`, else `max_model_len`) minus the prompt, so the budget
    /// holds whatever the request does. A number reserves less; tokens beyond it are charged
    /// when the request ends, in the window they happen in (a budget can then be overrun by
    /// the requests already running).
    pub default_output_tokens: Option<u32>,
    /// The context length (vLLM's `--max-model-len`) of every model without its own
    /// `[models.X].max_model_len`: a request without an output limit reserves up to it, and a
    /// body the proxy could not read is charged it (prompt plus output of one sequence never
    /// exceed it).
    pub max_model_len: u32,
    /// When the shared (Redis) ledger cannot be reached: `local` admits against this
    /// replica's share of each budget (budget / `replicas`, counted as degraded); `reject`
    /// answers 503 with Retry-After.
    pub when_store_unavailable: WhenUnavailable,
    /// Replicas sharing the budgets (the local share's divisor).
    pub replicas: u64,
    /// How long an admission may wait for the shared ledger before it counts as unreachable.
    pub store_timeout_ms: u64,
    /// Tenants with their own metric series; every other tenant is counted as `other`.
    pub metrics_tenants: Vec<String>,
    /// Tenant -> budget. `"*"`: every tenant without its own entry (each one separately).
    pub budgets: BTreeMap<String, Budget>,
}

impl Default for TenancyConfig {
    fn default() -> Self {
        TenancyConfig {
            default_output_tokens: None,
            max_model_len: 32_768,
            when_store_unavailable: WhenUnavailable::Local,
            replicas: 1,
            store_timeout_ms: 20,
            metrics_tenants: Vec::new(),
            budgets: BTreeMap::new(),
        }
    }
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum WhenUnavailable {
    Local,
    Reject,
}

/// One tenant's budget, and optionally its per-model budgets (a request for a listed model
/// is charged to that model's budget instead of the tenant's).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Budget {
    pub tokens_per_minute: Option<u64>,
    pub requests_per_minute: Option<u64>,
    pub concurrent_requests: Option<u64>,
    pub models: BTreeMap<String, Limits>,
}

impl Budget {
    pub fn limits(&self) -> Limits {
        Limits {
            tokens_per_minute: self.tokens_per_minute,
            requests_per_minute: self.requests_per_minute,
            concurrent_requests: self.concurrent_requests,
        }
    }
}

/// Whether `name` can be a tenant: 1..=128 printable ASCII characters, no spaces.
pub fn valid_tenant(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_TENANT_LEN && name.bytes().all(|b| b.is_ascii_graphic())
}

impl TenancyConfig {
    pub fn validate(&self) -> Result<(), (String, String)> {
        let bad = |field: String, message: &str| Err((field, message.to_string()));
        if self.replicas == 0 {
            return bad("tenancy.replicas".into(), "must be > 0");
        }
        if self.store_timeout_ms == 0 {
            return bad("tenancy.store_timeout_ms".into(), "must be > 0");
        }
        if self.max_model_len == 0 {
            return bad("tenancy.max_model_len".into(), "must be > 0");
        }
        for (tenant, budget) in &self.budgets {
            if tenant != "*" && !valid_tenant(tenant) {
                return bad(format!("tenancy.budgets.{tenant:?}"), "a tenant is 1 to 128 printable characters, no spaces");
            }
            let all = std::iter::once((String::new(), budget.limits())).chain(budget.models.iter().map(|(m, l)| (format!(".models.{m:?}"), *l)));
            for (at, limits) in all {
                let zero = [limits.tokens_per_minute, limits.requests_per_minute, limits.concurrent_requests].contains(&Some(0));
                if zero {
                    return bad(format!("tenancy.budgets.{tenant:?}{at}"), "a limit of 0 admits nothing: omit it for unlimited, or remove the tenant's access");
                }
            }
        }
        if let Some(t) = self.metrics_tenants.iter().find(|t| !valid_tenant(t)) {
            return bad("tenancy.metrics_tenants".into(), &format!("{t:?} is not a tenant name"));
        }
        Ok(())
    }

    pub fn has_budgets(&self) -> bool {
        !self.budgets.is_empty()
    }

    /// The configured scope and limits a request of `tenant` for `model` is charged to.
    fn configured(&self, tenant: &str, model: &str) -> Option<(Option<&str>, Limits)> {
        let budget = self.budgets.get(tenant).or_else(|| self.budgets.get("*"))?;
        match budget.models.get_key_value(model) {
            Some((m, limits)) => Some((Some(m.as_str()), *limits)),
            None => Some((None, budget.limits())),
        }
    }
}

/// What admission decided.
#[derive(Clone, Debug, PartialEq)]
pub enum Admission {
    /// No budget applies (no tenant, or none configured for it).
    Unlimited,
    /// Reserved under `scope`; the completion settles it.
    Admitted { scope: Scope, degraded: bool },
    Rejected(Rejection),
}

impl Admission {
    pub fn scope(&self) -> Option<&Scope> {
        match self {
            Admission::Admitted { scope, .. } => Some(scope),
            _ => None,
        }
    }
}

/// One pick's charge: what admission reserves.
#[derive(Clone, Debug)]
pub struct Charge<'a> {
    pub tenant: &'a str,
    pub model: &'a str,
    pub id: u64,
    /// Predicted uncached prompt tokens (on the chosen worker) + the output reservation.
    pub tokens: u64,
}

/// Budgets at runtime: the configured limits, the ledger (shared through the store, or this
/// replica's), and the local fallback ledger for when the shared one is away.
pub struct Tenants {
    config: TenancyConfig,
    shared: Option<Arc<dyn Ledger>>,
    local: Arc<MemoryLedger>,
    lease_ms: u64,
    seen: Mutex<VecDeque<Arc<str>>>,
    /// The runtime overrides as last read from the ledger (its own are authoritative; this
    /// copy says which scopes exist beyond the configured ones).
    overridden: parking_lot::RwLock<BTreeMap<Scope, Limits>>,
    metrics: TenantMetrics,
}

/// The tenants' metric families; every tenant label is [`Tenants::label`], never an
/// unbounded name.
struct TenantMetrics {
    /// Budgeted picks by tenant (allowlisted, else `other`) and outcome.
    requests: Family<TenantLabels, Counter>,
    /// Budget tokens by tenant and kind: `reserved` at admission, `charged` when settled,
    /// and the usage the responses reported (`prompt`, `cached`, `completion`).
    tokens: Family<TenantTokenLabels, Counter>,
    /// Admissions decided without the shared ledger (unreachable: local share or reject).
    degraded: Counter,
}

impl TenantMetrics {
    fn register(registry: &mut Registry) -> TenantMetrics {
        let m = TenantMetrics { requests: Family::default(), tokens: Family::default(), degraded: Counter::default() };
        registry.register("tenant_requests", "Budgeted requests by tenant and outcome (admitted, rejected_<limit>)", m.requests.clone());
        registry.register("tenant_tokens", "Budget tokens by tenant and kind (reserved, charged; usage: prompt, cached, completion)", m.tokens.clone());
        registry.register("budget_degraded", "Admissions decided without the shared budget ledger (it was unreachable)", m.degraded.clone());
        m
    }

    fn request(&self, tenant: &str, outcome: &str) {
        self.requests.get_or_create(&TenantLabels { tenant: tenant.into(), outcome: outcome.into() }).inc();
    }

    fn tokens(&self, tenant: &str, kind: &'static str, n: u64) {
        if n > 0 {
            self.tokens.get_or_create(&TenantTokenLabels { tenant: tenant.into(), kind: kind.into() }).inc_by(n);
        }
    }
}

/// How often a replica re-reads the shared ledger's overrides (another replica's admin call
/// takes effect here within this; its limits take effect at once, they live in the ledger).
pub const OVERRIDES_REFRESH: Duration = Duration::from_secs(2);

impl Tenants {
    /// `shared`: the store's ledger (Redis), `None` with the memory store. `lease_ms`: how
    /// long a concurrency slot lives without its settle (the assignment TTL).
    pub fn new(config: TenancyConfig, shared: Option<Arc<dyn Ledger>>, lease_ms: u64, registry: &mut Registry) -> Tenants {
        Tenants {
            metrics: TenantMetrics::register(registry),
            config,
            shared,
            local: MemoryLedger::new(),
            lease_ms,
            seen: Mutex::new(VecDeque::new()),
            overridden: parking_lot::RwLock::new(BTreeMap::new()),
        }
    }

    /// Whether budgets are shared with other replicas (then [`Tenants::refresh`] runs).
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// Re-reads the ledger's overrides.
    pub async fn refresh(&self) -> Result<(), ledger::LedgerError> {
        let all = self.ledger().overrides().await?;
        *self.overridden.write() = all.into_iter().collect();
        Ok(())
    }

    pub fn config(&self) -> &TenancyConfig {
        &self.config
    }

    /// The ledger admissions go to first.
    fn ledger(&self) -> &dyn Ledger {
        match &self.shared {
            Some(l) => l.as_ref(),
            None => self.local.as_ref(),
        }
    }

    /// The metric label for `tenant`: itself when allowlisted, `none` without one, else `other`.
    pub fn label(&self, tenant: &str) -> String {
        if tenant.is_empty() {
            "none".into()
        } else if self.config.metrics_tenants.iter().any(|t| t == tenant) {
            tenant.into()
        } else {
            "other".into()
        }
    }

    fn remember(&self, tenant: &str) {
        let mut seen = self.seen.lock();
        if seen.front().is_some_and(|t| &**t == tenant) {
            return;
        }
        seen.retain(|t| &**t != tenant);
        seen.push_front(tenant.into());
        seen.truncate(SEEN_TENANTS);
    }

    /// The scope and limits `tenant`'s request for `model` is charged to, or `None`: the
    /// tenant's budget for the model when one is configured or set at runtime, else the
    /// tenant's own.
    pub fn scope_for(&self, tenant: &str, model: &str) -> Option<(Scope, Limits)> {
        let overridden = self.overridden.read();
        let of_model = Scope { tenant: tenant.into(), model: Some(model.into()) };
        if let Some(l) = overridden.get(&of_model) {
            return Some((of_model, *l));
        }
        let configured = self.config.configured(tenant, model);
        if let Some((Some(m), limits)) = configured {
            return Some((Scope { tenant: tenant.into(), model: Some(m.into()) }, limits));
        }
        let own = Scope { tenant: tenant.into(), model: None };
        match (overridden.get(&own), configured) {
            (Some(l), _) => Some((own, *l)),
            (None, Some((_, limits))) => Some((own, limits)),
            (None, None) => None,
        }
    }

    /// Reserves `charge` against its tenant's budget (see the module docs).
    pub async fn admit(&self, charge: &Charge<'_>) -> Admission {
        let metrics = &self.metrics;
        if charge.tenant.is_empty() {
            return Admission::Unlimited;
        }
        self.remember(charge.tenant);
        let label = self.label(charge.tenant);
        let Some((scope, limits)) = self.scope_for(charge.tenant, charge.model) else {
            metrics.request(&label, "admitted");
            return Admission::Unlimited;
        };
        let reserve = ledger::Reserve { scope: scope.clone(), id: charge.id, tokens: charge.tokens, limits, window_ms: WINDOW_MS, lease_ms: self.lease_ms };
        let timeout = Duration::from_millis(self.config.store_timeout_ms);
        let (outcome, degraded) = match &self.shared {
            None => (self.local.reserve_now(&reserve), false),
            Some(shared) => match tokio::time::timeout(timeout, shared.reserve(reserve.clone())).await {
                Ok(Ok(outcome)) => (outcome, false),
                failed => {
                    let why = match failed {
                        Ok(Err(e)) => e.to_string(),
                        _ => format!("no answer in {timeout:?}"),
                    };
                    metrics.degraded.inc();
                    tracing::warn!(tenant = %scope, %why, policy = ?self.config.when_store_unavailable, "budget ledger unreachable");
                    match self.config.when_store_unavailable {
                        WhenUnavailable::Reject => {
                            metrics.request(&label, "rejected_unavailable");
                            return Admission::Rejected(Rejection {
                                limit: BudgetLimit::BudgetUnavailable as i32,
                                retry_after_ms: 1000,
                                message: format!("tenant {}: the budget store is unavailable", charge.tenant),
                            });
                        }
                        WhenUnavailable::Local => {
                            let local = ledger::Reserve { limits: limits.share(self.config.replicas), ..reserve };
                            (self.local.reserve_now(&local), true)
                        }
                    }
                }
            },
        };
        match outcome {
            Outcome::Admitted(_) => {
                metrics.request(&label, "admitted");
                metrics.tokens(&label, "reserved", charge.tokens);
                Admission::Admitted { scope, degraded }
            }
            Outcome::Rejected { limit, retry_after_ms, usage } => {
                metrics.request(&label, &format!("rejected_{}", limit.label()));
                let wire = match limit {
                    Limit::Tokens => BudgetLimit::BudgetTokens,
                    Limit::Requests => BudgetLimit::BudgetRequests,
                    Limit::Concurrency => BudgetLimit::BudgetConcurrency,
                };
                let message = rejection_message(&scope, limit, &limits, charge.tokens, &usage);
                tracing::info!(tenant = %scope, limit = limit.label(), retry_after_ms, "budget rejected a request");
                Admission::Rejected(Rejection { limit: wire as i32, retry_after_ms: retry_after_ms.min(u64::from(u32::MAX)) as u32, message })
            }
        }
    }

    /// Counts what a finished request's response said it used, under `tenant`'s label.
    pub fn count_usage(&self, tenant: &str, prompt: u32, cached: u32, completion: u32) {
        let label = self.label(tenant);
        self.metrics.tokens(&label, "prompt", u64::from(prompt));
        self.metrics.tokens(&label, "cached", u64::from(cached));
        self.metrics.tokens(&label, "completion", u64::from(completion));
    }

    /// Settles a finished request's reservation of `reserved` at what it really cost,
    /// `tokens`, and counts the charge.
    pub fn settle_charged(&self, scope: Scope, id: u64, tokens: u64, reserved: u64) {
        self.metrics.tokens(&self.label(&scope.tenant), "charged", tokens);
        self.settle(scope, id, tokens, reserved);
    }

    /// Settles reservation `id` of `scope` (it charged `reserved`) at `tokens`, on every
    /// ledger that may hold it.
    pub fn settle(&self, scope: Scope, id: u64, tokens: u64, reserved: u64) {
        let s = ledger::Settle { scope, id, tokens, reserved, window_ms: WINDOW_MS };
        self.local.settle_now(&s);
        if let Some(shared) = self.shared.clone() {
            tokio::spawn(async move {
                if let Err(e) = shared.settle(s).await {
                    // The reservation keeps its charge until it ages out; the lease its TTL.
                    tracing::debug!(error = %e, "budget settle not stored");
                }
            });
        }
    }

    /// Every tenant this replica knows of (configured, overridden, or seen), with each scope's
    /// limits and usage over the current window.
    pub async fn report(&self) -> Result<Vec<TenantReport>, ledger::LedgerError> {
        let overrides: BTreeMap<Scope, Limits> = self.ledger().overrides().await?.into_iter().collect();
        let mut tenants: BTreeSet<String> = self.config.budgets.keys().filter(|t| *t != "*").cloned().collect();
        tenants.extend(overrides.keys().map(|s| s.tenant.to_string()));
        tenants.extend(self.seen.lock().iter().map(|t| t.to_string()));
        let mut out = Vec::new();
        for tenant in tenants {
            let mut scopes: Vec<(Scope, Limits)> = Vec::new();
            if let Some(budget) = self.config.budgets.get(&tenant).or_else(|| self.config.budgets.get("*")) {
                scopes.push((Scope { tenant: tenant.as_str().into(), model: None }, budget.limits()));
                scopes.extend(budget.models.iter().map(|(m, l)| (Scope { tenant: tenant.as_str().into(), model: Some(m.as_str().into()) }, *l)));
            }
            for (s, l) in overrides.iter().filter(|(s, _)| *s.tenant == *tenant) {
                match scopes.iter_mut().find(|(have, _)| have == s) {
                    Some(entry) => entry.1 = *l,
                    None => scopes.push((s.clone(), *l)),
                }
            }
            let mut budgets = Vec::new();
            for (scope, configured) in scopes {
                let limits = overrides.get(&scope).copied().unwrap_or(configured);
                let used = self.ledger().usage(scope.clone(), WINDOW_MS).await?;
                budgets.push(ScopeReport {
                    model: scope.model.as_deref().map(str::to_string),
                    limits,
                    overridden: overrides.contains_key(&scope),
                    used,
                    remaining: Remaining::of(&limits, &used),
                });
            }
            out.push(TenantReport { tenant, budgets });
        }
        Ok(out)
    }

    /// Overrides (or, with `None`, restores) the limits of `tenant`'s budget (of `model`'s,
    /// when given) on every replica sharing the ledger.
    pub async fn set_limits(&self, tenant: &str, model: Option<&str>, limits: Option<Limits>) -> Result<(), ledger::LedgerError> {
        let scope = Scope { tenant: tenant.into(), model: model.map(Into::into) };
        match &self.shared {
            Some(shared) => shared.set_limits(scope.clone(), limits).await?,
            // Only without a shared ledger: the local one's degraded share is computed from
            // the override held here.
            None => self.local.set_limits(scope.clone(), limits).await?,
        }
        let mut overridden = self.overridden.write();
        match limits {
            Some(l) => overridden.insert(scope, l),
            None => overridden.remove(&scope),
        };
        Ok(())
    }
}

fn rejection_message(scope: &Scope, limit: Limit, limits: &Limits, tokens: u64, usage: &Usage) -> String {
    match limit {
        Limit::Tokens => {
            let max = limits.tokens_per_minute.unwrap_or(0);
            if tokens > max {
                format!("tenant {scope}: this request needs {tokens} tokens, more than the budget of {max} tokens per minute")
            } else {
                format!("tenant {scope}: rate limit of {max} tokens per minute reached ({} used, this request needs {tokens})", usage.tokens)
            }
        }
        Limit::Requests => format!("tenant {scope}: rate limit of {} requests per minute reached", limits.requests_per_minute.unwrap_or(0)),
        Limit::Concurrency => format!("tenant {scope}: {} requests already running, the limit", limits.concurrent_requests.unwrap_or(0)),
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct TenantReport {
    pub tenant: String,
    pub budgets: Vec<ScopeReport>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ScopeReport {
    /// The model this budget applies to; absent for the tenant's own budget.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub limits: Limits,
    /// The limits were changed at runtime (admin API), not the configuration's.
    pub overridden: bool,
    pub used: Usage,
    pub remaining: Remaining,
}

/// What is left over the current window; `None` is unlimited.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Remaining {
    pub tokens: Option<u64>,
    pub requests: Option<u64>,
    pub concurrent: Option<u64>,
}

impl Remaining {
    fn of(l: &Limits, u: &Usage) -> Remaining {
        Remaining {
            tokens: l.tokens_per_minute.map(|m| m.saturating_sub(u.tokens)),
            requests: l.requests_per_minute.map(|m| m.saturating_sub(u.requests)),
            concurrent: l.concurrent_requests.map(|m| m.saturating_sub(u.concurrent)),
        }
    }
}
