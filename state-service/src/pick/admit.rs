//! Stage 4: admission. A request with a tenant whose budget applies is charged, between the
//! decision and its record, the predicted uncached prompt tokens on the chosen worker plus its
//! output reservation; one that does not fit is answered with a rejection and leaves nothing
//! behind.

use super::plan::Chosen;
use super::Picker;
use crate::tenancy::{Admission, Charge};
use kvroute_core::wire::PickRequest;
use rand::RngCore;

impl Picker {
    /// The assignment id the budget's reservation (and then the assignment) is named by, and
    /// what the budget decided.
    pub(super) async fn admit(&self, req: &PickRequest, chosen: &Chosen) -> (u64, Admission) {
        // The proxy's id (it cancels and reports by it), else one drawn now.
        let id = match req.assignment_id {
            0 => self.selector.rng().next_u64() ^ self.fleet.replication().id_salt(),
            id => id,
        };
        let output = match req.max_tokens {
            0 => self.tenants.config().default_output_tokens,
            n => n,
        };
        let charge = Charge { tenant: &req.tenant, model: &req.model, id, tokens: u64::from(chosen.uncached_tokens()) + u64::from(output) };
        (id, self.tenants.admit(&charge).await)
    }
}
