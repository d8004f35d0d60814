//! NGINX (Kong's ngx_wasm_module) runs the same end-to-end tests as Envoy: routing.rs,
//! spoofing.rs, resilience.rs and failover.rs take their proxy from `kvroute_e2e::host` and loop
//! over `hosts()` (Envoy, plus NGINX when `KVROUTE_NGINX` names an NGINX built with the module;
//! without it they print one "skipped" line). What stays here is NGINX's own: the example
//! config is the tested template.

use anyhow::Result;
use kvroute_e2e::nginx;

/// `envoy/nginx-wasm.conf` is the tested template with example values (rewrite it with
/// `KVROUTE_BLESS=1`).
#[test]
fn the_nginx_example_is_the_tested_template() -> Result<()> {
    let path = kvroute_e2e::paths::repo_root().join("envoy/nginx-wasm.conf");
    let example = nginx::example()?;
    if std::env::var_os("KVROUTE_BLESS").is_some() {
        std::fs::write(&path, &example)?;
    }
    assert_eq!(std::fs::read_to_string(&path)?, example, "envoy/nginx-wasm.conf is stale: KVROUTE_BLESS=1 cargo test -p kvroute-e2e --test nginx");
    Ok(())
}
