//! The embedded store: one instance, nothing shared, nothing survives a restart. Every
//! [`SharedStore`] hook keeps its no-op default.

use super::SharedStore;

#[derive(Clone, Copy, Debug, Default)]
pub struct MemoryStore;

impl SharedStore for MemoryStore {}
