//! What replicas tell each other, as JSON: the assignment record kept under
//! `{prefix}:asg:{id}` (TTL = the assignment's remaining life), the runtime-registered
//! worker's config under `{prefix}:worker:{id}` (no TTL), and the events published on
//! `{prefix}:events` of the shard that owns the key.

use crate::assign::{Assignment, AssignmentId};
use crate::config::WorkerConfig;
use crate::tenancy::Ending;
use kvroute_score::{Features, Policy};
use kvroute_kv::types::{BlockKey, WorkerId};
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
    /// The tenant budget it reserved under (tenant, model), so any replica settles it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<(String, Option<String>)>,
    /// Tokens admission reserved (settling a request abandoned after forwarding).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reserved: u64,
    /// Responses API `background`: settled from the stored response.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub background: bool,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Event {
    Assigned(Record),
    FirstToken { id: u64, elapsed_ms: f64 },
    /// `ending`: how the request ended, when the sender did not hold the pick (the replica
    /// that does settles its budget by it).
    Freed {
        id: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ending: Option<Ending>,
    },
    /// A cancel of an id the sender never recorded: discarded or freed wherever it is.
    Cancelled {
        id: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ending: Option<Ending>,
    },
    /// A worker registered at runtime on some replica.
    WorkerAdded(Box<WorkerConfig>),
    WorkerRemoved { id: String },
    /// The proxy saw the worker fail (`reason`: the contract's UpstreamFailure number).
    WorkerSuspect { id: String, reason: i32 },
    /// New picks to the worker stopped.
    WorkerDraining { id: String },
    /// Liveness only: every replica publishes one on every shard's channel each
    /// `heartbeat_ms`, so a subscription that hears nothing knows it is dead. Never applied.
    Heartbeat,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub from: String,
    pub event: Event,
}

/// How long an assignment lives: until its first token at most `first_token`, in all at
/// most `assignment` (the table's expiry, [`crate::assign::Assignments::expire`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ttls {
    pub assignment: Duration,
    pub first_token: Duration,
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
            budget: a.budget.as_ref().map(|s| (s.tenant.to_string(), s.model.as_deref().map(str::to_string))),
            reserved: a.reserved,
            background: a.background,
        }
    }

    /// How long ago the pick was made, by the wall clock (clamped at zero).
    pub fn age(&self) -> Duration {
        Duration::from_millis(unix_ms().saturating_sub(self.created_unix_ms))
    }

    /// The life of the assignment this record stands for, from its creation.
    pub fn ttl(&self, ttls: Ttls) -> Duration {
        match self.first_token {
            true => ttls.assignment,
            false => ttls.first_token,
        }
    }

    /// The local assignment, its times moved back by the record's age; `None` when the record
    /// is stale: older than its TTL (another replica would have expired it already), or so
    /// old that this process's clock cannot go back that far (never taken as created now).
    pub fn assignment(&self, now: Instant, ttls: Ttls) -> Option<Assignment> {
        self.assignment_aged(now, ttls, self.age())
    }

    fn assignment_aged(&self, now: Instant, ttls: Ttls, age: Duration) -> Option<Assignment> {
        if age >= self.ttl(ttls) {
            return None;
        }
        let created_at = now.checked_sub(age)?;
        let [steps, tokens, fixed_ms] = self.features;
        Some(Assignment {
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
            budget: self.budget.as_ref().map(|(t, m)| crate::tenancy::Scope { tenant: t.as_str().into(), model: m.as_deref().map(Into::into) }),
            reserved: self.reserved,
            background: self.background,
        })
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
            budget: Some(crate::tenancy::Scope { tenant: "team".into(), model: None }),
            reserved: 900,
            background: true,
        };
        let r = Record::new(&a, &[BlockKey(1), BlockKey(u64::MAX)], "r1");
        let m = Message { from: "r1".into(), event: Event::Assigned(r.clone()) };
        let back: Message = serde_json::from_str(&serde_json::to_string(&m).expect("encodes")).expect("decodes");
        assert_eq!(back, m);
        let b = r.assignment(now, TTLS).expect("a fresh record is live");
        assert_eq!((b.id, b.worker, b.features, b.first_token_at), (a.id, a.worker, a.features, None));
        assert_eq!((b.budget, b.reserved, b.background), (a.budget, 900, true), "any replica can settle it");
        assert_eq!(r.keys(), vec![BlockKey(1), BlockKey(u64::MAX)]);
    }

    const TTLS: Ttls = Ttls { assignment: Duration::from_secs(600), first_token: Duration::from_secs(120) };

    fn record(age: Duration, first_token: bool) -> Record {
        Record {
            id: 7,
            replica: "other".into(),
            worker: "w0".into(),
            policy: Policy::Kvroute,
            prompt_tokens: 10,
            uncached_tokens: 10,
            predicted_ttft_ms: 1.0,
            features: [1.0, 10.0, 0.0],
            keys: vec![],
            created_unix_ms: unix_ms() - age.as_millis() as u64,
            first_token,
            budget: None,
            reserved: 0,
            background: false,
        }
    }

    #[tokio::test]
    async fn stale_records_are_not_adopted() {
        let now = Instant::now();
        let s = Duration::from_secs;
        // Waiting for its first token: the first-token TTL bounds it.
        let live = record(s(100), false).assignment(now, TTLS).expect("inside the first-token TTL");
        let age = now - live.created_at;
        assert!(age >= s(100) && age < s(101), "created_at moved back by the age: {age:?}");
        assert!(record(s(121), false).assignment(now, TTLS).is_none(), "past the first-token TTL");
        // Past its first token: the assignment TTL bounds it.
        assert!(record(s(121), true).assignment(now, TTLS).is_some());
        assert!(record(s(601), true).assignment(now, TTLS).is_none(), "past the assignment TTL");
        // Written in 1970 (a zero or garbage timestamp): stale, not brand new.
        let ancient = Record { created_unix_ms: 0, ..record(s(0), true) };
        assert!(ancient.assignment(now, TTLS).is_none());
    }

    #[tokio::test]
    async fn an_age_the_clock_cannot_represent_is_never_taken_as_now() {
        let forever = Ttls { assignment: Duration::MAX, first_token: Duration::MAX };
        let r = record(Duration::ZERO, true);
        let now = Instant::now();
        // Inside the (unbounded) TTL, but no Instant lies that far back: not adopted, where
        // `checked_sub(age).unwrap_or(now)` made it brand new.
        let age = Duration::from_secs(u64::MAX);
        assert!(age < forever.assignment && now.checked_sub(age).is_none());
        assert!(r.assignment_aged(now, forever, age).is_none());
        assert!(r.assignment_aged(now, forever, Duration::from_secs(1)).is_some());
    }

    #[test]
    fn an_end_carries_how_the_request_ended_and_reads_without_it() {
        let ending = Ending { completed: true, status: 200, prompt_tokens: 32, cached_tokens: Some(16), completion_tokens: 7, ..Ending::default() };
        let e = Event::Freed { id: 9, ending: Some(ending) };
        let json = serde_json::to_string(&e).unwrap();
        assert_eq!(serde_json::from_str::<Event>(&json).unwrap(), e);
        // From a replica that sends none: no ending, nothing settled by it.
        assert_eq!(serde_json::from_str::<Event>(r#"{"kind":"cancelled","id":9}"#).unwrap(), Event::Cancelled { id: 9, ending: None });
        use super::super::replicate::Tombstone;
        let t = Tombstone { id: 9, ending: Some(ending) };
        let back = Tombstone::parse(t.value().as_bytes()).unwrap();
        assert_eq!((back.id, back.ending), (9, Some(ending)));
        let plain = Tombstone::parse(b"61453").unwrap();
        assert_eq!((plain.id, plain.ending), (61453, None));
        assert!(Tombstone::parse(b"not a tombstone").is_none());
    }
}
