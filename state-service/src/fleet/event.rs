//! The one way the fleet model changes, and what a change did.

use super::{AddWorkerError, WorkerEntry};
use crate::assign::{Assignment, AssignmentId};
use crate::config::WorkerConfig;
use crate::score::Calibration;
use crate::types::{BlockKey, WorkerId};
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

/// A change to the fleet, from a local pick, report or admin call, or from another replica.
#[derive(Clone, Debug, PartialEq)]
pub enum FleetEvent {
    /// A pick chose `assignment.worker`; `credit` are the keys it is credited with until its
    /// KV events arrive (empty when the pick had no exact keys or the policy gives none).
    Assigned { assignment: Assignment, credit: Arc<[BlockKey]> },
    /// The first token arrived `elapsed_ms` after the request was forwarded.
    FirstToken { id: AssignmentId, elapsed_ms: f64 },
    Completed { id: AssignmentId, usage: Usage },
    Cancelled { id: AssignmentId },
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

/// What [`super::Fleet::apply`] did.
#[derive(Debug)]
pub enum Applied {
    Assigned,
    /// A live assignment got its first token; `calibration` is the worker's refit, when the
    /// elapsed time was usable.
    FirstToken { assignment: Assignment, calibration: Option<Calibration> },
    Freed(Assignment),
    WorkerAdded(Arc<WorkerEntry>),
    WorkerRemoved(Arc<WorkerEntry>),
    /// A restored calibration was installed.
    Calibrated,
    /// The worker was marked suspect or draining (it was not before).
    Marked(Arc<WorkerEntry>),
    /// Already applied (a repeated report, a replicated assignment known here).
    Duplicate,
    /// The pick's id was cancelled before it was recorded: nothing was.
    Abandoned,
    /// Nothing to apply it to: an unknown or already-freed assignment, an unknown worker.
    Unknown,
    /// The worker was not registered.
    Rejected(AddWorkerError),
}
