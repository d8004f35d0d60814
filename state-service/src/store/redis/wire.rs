//! What replicas tell each other, as JSON: the assignment record kept under
//! `{prefix}:asg:{id}` (TTL = the assignment's remaining life), the runtime-registered
//! worker's config under `{prefix}:worker:{id}` (no TTL), and the events published on
//! `{prefix}:events` of the shard that owns the key.

use crate::assign::{Assignment, AssignmentId};
use crate::config::WorkerConfig;
use crate::score::{Features, Policy};
use crate::types::{BlockKey, WorkerId};
use serde::{Deserialize, Serialize};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// An in-flight assignment as other replicas need it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub id: u64,
    /// The replica that made the pick.
    pub replica: String,
    pub worker: String,
    pub policy: Policy,
    pub prompt_tokens: u32,
    pub uncached_tokens: u32,
    pub predicted_ttft_ms: f64,
    /// Features (steps, tokens, fixed_ms) for calibration.
    pub features: [f64; 3],
    /// Keys credited to the worker (speculative entries); empty when none.
    #[serde(default)]
    pub keys: Vec<u64>,
    pub created_unix_ms: u64,
    #[serde(default)]
    pub first_token: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Event {
    Assigned(Record),
    FirstToken { id: u64, elapsed_ms: f64 },
    Freed { id: u64 },
    /// A worker registered at runtime on some replica.
    WorkerAdded(Box<WorkerConfig>),
    WorkerRemoved { id: String },
    /// The proxy saw the worker fail (`reason`: the contract's UpstreamFailure number).
    WorkerSuspect { id: String, reason: i32 },
    /// New picks to the worker stopped.
    WorkerDraining { id: String },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub from: String,
    pub event: Event,
}

pub fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Record {
    pub fn new(a: &Assignment, keys: &[BlockKey], replica: &str) -> Record {
        let age = a.created_at.elapsed().as_millis() as u64;
        Record {
            id: a.id.0,
            replica: replica.to_string(),
            worker: a.worker.to_string(),
            policy: a.policy,
            prompt_tokens: a.prompt_tokens,
            uncached_tokens: a.uncached_tokens,
            predicted_ttft_ms: a.predicted_ttft_ms,
            features: [a.features.steps, a.features.tokens, a.features.fixed_ms],
            keys: keys.iter().map(|k| k.0).collect(),
            created_unix_ms: unix_ms().saturating_sub(age),
            first_token: a.first_token_at.is_some(),
        }
    }

    /// How long ago the pick was made, by the wall clock (clamped at zero).
    pub fn age(&self) -> Duration {
        Duration::from_millis(unix_ms().saturating_sub(self.created_unix_ms))
    }

    /// The local assignment, its times moved back by the record's age.
    pub fn assignment(&self, now: Instant) -> Assignment {
        let created_at = now.checked_sub(self.age()).unwrap_or(now);
        let [steps, tokens, fixed_ms] = self.features;
        Assignment {
            id: AssignmentId(self.id),
            worker: WorkerId::new(&self.worker),
            policy: self.policy,
            prompt_tokens: self.prompt_tokens,
            uncached_tokens: self.uncached_tokens,
            predicted_ttft_ms: self.predicted_ttft_ms,
            features: Features { steps, tokens, fixed_ms },
            created_at,
            first_token_at: self.first_token.then_some(now),
            predicted_cached_tokens: None,
        }
    }

    pub fn keys(&self) -> Vec<BlockKey> {
        self.keys.iter().map(|k| BlockKey(*k)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn records_round_trip() {
        let now = Instant::now();
        let a = Assignment {
            id: AssignmentId(42),
            worker: WorkerId::new("w1"),
            policy: Policy::Kvroute,
            prompt_tokens: 100,
            uncached_tokens: 60,
            predicted_ttft_ms: 12.5,
            features: Features { steps: 2.0, tokens: 60.0, fixed_ms: 1.0 },
            created_at: now,
            first_token_at: None,
            predicted_cached_tokens: None,
        };
        let r = Record::new(&a, &[BlockKey(1), BlockKey(u64::MAX)], "r1");
        let m = Message { from: "r1".into(), event: Event::Assigned(r.clone()) };
        let back: Message = serde_json::from_str(&serde_json::to_string(&m).expect("encodes")).expect("decodes");
        assert_eq!(back, m);
        let b = r.assignment(now);
        assert_eq!((b.id, b.worker, b.features, b.first_token_at), (a.id, a.worker, a.features, None));
        assert_eq!(r.keys(), vec![BlockKey(1), BlockKey(u64::MAX)]);
    }
}
