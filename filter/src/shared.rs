//! What every HTTP context of a VM shares with its root context. It has its own module so that
//! `root` (which creates HTTP contexts) and `http` (which reads this) depend on it, not on each
//! other.

use crate::config::Config;
use crate::metrics::Metrics;
use crate::report::ReportQueue;
use std::cell::RefCell;

pub struct Shared {
    pub config: Config,
    pub metrics: Metrics,
    pub reports: RefCell<ReportQueue>,
}
