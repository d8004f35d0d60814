//! kvroute-state (in progress).
