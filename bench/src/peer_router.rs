//! The real SGLang router (`sglang-router` on PyPI, a Rust binary) in front of the same
//! workers, as one more row of a comparison (`--policies ...,sglang_router`): the peer as a
//! user would run it, with its own defaults, so the reimplementation (`sglang_cache_aware`,
//! run through Envoy and the state service) is measured against it rather than assumed equal.
//!
//! Each pass gets a fresh router: its radix tree would otherwise carry one pass's prefixes
//! into the next, while every worker's cache is reset between passes. Requests go to the
//! router instead of Envoy; the state service is not in their path.

use crate::stack::process::Managed;
use crate::BenchError;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The row's name in `--policies` and in the results.
pub const SGLANG_ROUTER: &str = "sglang_router";

/// How to start the real router in front of the workers.
#[derive(Clone, Debug)]
pub struct PeerRouter {
    pub bin: PathBuf,
    pub workers: Vec<String>,
    pub port: u16,
    /// Where its log goes (`sglang_router.log`).
    pub work_dir: PathBuf,
    /// `--policy` (the router's `cache_aware` by default, as SGLang ships it).
    pub policy: String,
    /// More `launch` flags (e.g. its queue: `--max-concurrent-requests`, `--queue-size`).
    pub extra: Vec<String>,
}

impl PeerRouter {
    /// The `sglang-router` binary: `explicit`, else `$SGLANG_ROUTER`, else the project's
    /// venv (`.cache/venv/bin`), else `PATH`.
    pub fn find(explicit: Option<&Path>, root: &Path) -> Option<PathBuf> {
        if let Some(p) = explicit {
            return Some(p.to_path_buf());
        }
        if let Some(p) = std::env::var_os("SGLANG_ROUTER") {
            return Some(PathBuf::from(p));
        }
        let venv = root.join(".cache/venv/bin/sglang-router");
        if venv.exists() {
            return Some(venv);
        }
        std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join("sglang-router")).find(|p| p.exists())
    }

    /// `sglang-router launch` arguments: every worker, the policy, loopback only.
    pub fn args(&self) -> Vec<String> {
        let mut a: Vec<String> = ["launch", "--host", "127.0.0.1", "--port"].map(String::from).to_vec();
        a.push(self.port.to_string());
        a.push("--policy".into());
        a.push(self.policy.clone());
        a.extend(self.extra.iter().cloned());
        a.push("--worker-urls".into());
        a.extend(self.workers.iter().cloned());
        a
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Starts a fresh router and waits until it answers and has taken its workers in.
    pub async fn start(&self) -> Result<Managed, BenchError> {
        let mut child = vec![Managed::spawn(SGLANG_ROUTER, &self.bin, &self.args(), &self.work_dir, &[])?];
        crate::stack::wait_http(&format!("{}/health", self.url()), Duration::from_secs(30), &mut child).await?;
        // It marks its workers healthy in a workflow after it answers (tens of ms here).
        tokio::time::sleep(Duration::from_secs(1)).await;
        child.pop().ok_or_else(|| BenchError::Stack("sglang-router did not start".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_router_is_launched_on_loopback_in_front_of_every_worker() {
        let r = PeerRouter {
            bin: "sglang-router".into(),
            workers: vec!["http://127.0.0.1:18100".into(), "http://127.0.0.1:18101".into()],
            port: 18090,
            work_dir: "/tmp".into(),
            policy: "cache_aware".into(),
            extra: vec!["--max-concurrent-requests".into(), "64".into()],
        };
        assert_eq!(
            r.args().join(" "),
            "launch --host 127.0.0.1 --port 18090 --policy cache_aware --max-concurrent-requests 64 --worker-urls http://127.0.0.1:18100 http://127.0.0.1:18101"
        );
        assert_eq!(r.url(), "http://127.0.0.1:18090");
        assert_eq!(PeerRouter::find(Some(Path::new("/x/sglang-router")), Path::new("/nowhere")), Some(PathBuf::from("/x/sglang-router")));
    }
}
