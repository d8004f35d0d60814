//! kvroute-e2e: a small harness for end-to-end tests that start real processes (Envoy with the
//! kvroute Wasm filter, the `kvroute-state` service, `kvroute-sim` workers) on loopback ports.
//!
//! - [`proc`]: child processes that are killed when their guard drops, logs in temp files.
//! - [`net`]: free-port picking and readiness polling with a deadline (polling a server until
//!   it answers is the only waiting the tests do; effects are observed, never slept for).
//! - [`paths`]: where the repository, the built binaries, the `.wasm` and Envoy are.
//! - [`envoy`]: renders the templates in `envoy/` and starts Envoy; [`nginx`]: the same for
//!   NGINX with ngx_wasm_module; [`host`]: either one behind one interface, so a test body runs
//!   against each host ([`host::hosts`]).
//! - [`redis`], [`replicas`]: `redis-server` shards and several state-service replicas
//!   (`store = "redis"`), each behind its own Envoy, in front of the same workers.
//! - [`overhead`]: the request-path overhead benchmarks' state service, prompts and cells.
//! - [`dns`]: a real DNS server (dnsmasq) whose records a discovery test changes.
//! - [`pki`]: certificates and JWT keys made at test time with openssl.
//! - [`fake`]: in-process fixtures (a fake state service and fake workers) for testing the
//!   filter's protocol handling independently of the real services.

pub mod dns;
pub mod envoy;
pub mod fake;
pub mod host;
pub mod llm;
pub mod net;
pub mod nginx;
pub mod overhead;
pub mod paths;
pub mod pki;
pub mod proc;
pub mod redis;
pub mod replicas;
pub mod stack;
