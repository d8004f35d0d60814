//! kvroute-filter (in progress).
