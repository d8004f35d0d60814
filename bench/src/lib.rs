//! kvroute-bench (in progress).
