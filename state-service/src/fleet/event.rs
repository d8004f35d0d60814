//! What changes the fleet: a change another replica made ([`FleetEvent`], in), what this
//! replica changed and shares ([`Change`], out), and what each typed operation did.

use crate::assign::{Assignment, AssignmentId};
use crate::config::WorkerConfig;
use crate::tenancy::Ending;
use kvroute_kv::types::{BlockKey, WorkerId};
use kvroute_score::Calibration;
use kvroute_core::wire::UpstreamFailure;
use std::sync::Arc;

/// What the response's `usage` said about a finished request (0 = not reported).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    /// vLLM's `prompt_tokens_details.cached_tokens` (`--enable-prompt-tokens-details`);
    /// `None` when the response did not carry it.
    pub cached_tokens: Option<u32>,
}

/// A change another replica made (or a warm start found), as the store delivers it.
#[derive(Clone, Debug, PartialEq)]
pub enum FleetEvent {
    /// A pick chose `assignment.worker`; `credit` are the keys it is credited with until its
    /// KV events arrive (empty when the pick had no exact keys or the policy gives none).
    Assigned { assignment: Assignment, credit: Arc<[BlockKey]> },
    /// The first token arrived `elapsed_ms` after the request was forwarded.
    FirstToken { id: AssignmentId, elapsed_ms: f64 },
    /// `ending`: how the proxy reported it, when the replica that heard the report did not
    /// hold the pick (so nobody has settled its budget); `None` otherwise.
    Completed { id: AssignmentId, ending: Option<Ending> },
    Cancelled { id: AssignmentId, ending: Option<Ending> },
    WorkerAdded(Box<WorkerConfig>),
    WorkerRemoved(WorkerId),
    /// A warm start found this fit of the worker's cost model.
    CalibrationRestored { worker: WorkerId, calibration: Calibration },
    /// The proxy saw the worker fail: no picks until a check of it succeeds (every replica
    /// checks for itself).
    Suspected { worker: WorkerId, reason: UpstreamFailure },
    /// New picks stop; the worker is removed once its in-flight requests are done.
    Draining(WorkerId),
}

/// What this replica changed, handed to [`super::Replication::publish`]: exactly what other
/// replicas need to hear (workers are shared by the admin call itself, before it answers).
#[derive(Debug)]
pub enum Change<'a> {
    Assigned { assignment: &'a Assignment, credit: &'a [BlockKey] },
    /// `calibration`: the worker's refit, when the elapsed time was usable.
    FirstToken { assignment: &'a Assignment, elapsed_ms: f64, calibration: Option<&'a Calibration> },
    Freed { id: AssignmentId },
    /// The proxy cancelled an id this replica never recorded: the replica that answered the
    /// pick (late, or frozen meanwhile) must discard or free it when it hears this, and
    /// settle its budget by `ending`.
    CancelledUnknown { id: AssignmentId, ending: Ending },
    /// The proxy reported the end of an id this replica does not hold (it never heard of
    /// the pick, or let it go): the replica that recorded the pick must free and settle it.
    CompletedUnknown { id: AssignmentId, ending: Ending },
    Suspected { worker: &'a WorkerId, reason: UpstreamFailure },
    Draining { worker: &'a WorkerId },
}

/// What [`super::Fleet::assign`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Assigned {
    Recorded,
    /// The id is taken by a live assignment: nothing was recorded (draw another).
    Taken,
    /// The id was cancelled before it was recorded: nothing was.
    Abandoned,
}

/// What [`super::Fleet::first_token`] did.
// Returned once per report and consumed at once: boxing the assignment would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum FirstToken {
    /// A live assignment got its first token; `calibration` is the worker's refit, when the
    /// elapsed time was usable.
    Marked { assignment: Assignment, calibration: Option<Calibration> },
    /// Its first token was reported before.
    Duplicate,
    /// No live assignment by that id (already freed, expired, or never ours).
    Unknown,
}

/// How an assignment ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    Completed,
    Cancelled,
}
