//! What every HTTP context of a VM shares with its root context. It has its own module so that
//! `root` (which creates HTTP contexts) and `http` (which reads this) depend on it, not on each
//! other.

use crate::config::Config;
use crate::metrics::Metrics;
use crate::report::ReportQueue;
use std::cell::{Cell, RefCell};

pub struct Shared {
    pub config: Config,
    pub metrics: Metrics,
    pub reports: RefCell<ReportQueue>,
    pub ids: AssignmentIds,
}

/// The assignment ids this VM names for its picks: SplitMix64 from a random per-VM seed, never
/// 0. A collision across VMs is improbable (64 bits) and harmless: the state service answers a
/// taken id with one of its own.
pub struct AssignmentIds(Cell<u64>);

impl AssignmentIds {
    pub fn seeded(seed: u64) -> AssignmentIds {
        AssignmentIds(Cell::new(seed))
    }

    pub fn next(&self) -> u64 {
        let state = self.0.get().wrapping_add(0x9E37_79B9_7F4A_7C15);
        self.0.set(state);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)).max(1)
    }
}
