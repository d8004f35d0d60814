//! Test credentials made at test time with `openssl`: a CA, a server and a client
//! certificate, an RS256 key whose JWKS Envoy's `jwt_authn` verifies with, and a second key
//! a forger signs with. Nothing is committed; every run makes its own in a fresh directory.

use crate::envoy::DownstreamTls;
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Sets made by this process (each in its own directory: tests run in parallel).
static MADE: AtomicUsize = AtomicUsize::new(0);

pub fn openssl(dir: &Path, args: &[&str]) -> Result<Vec<u8>> {
    let out = Command::new("openssl").args(args).current_dir(dir).output().context("running openssl (apt-get install openssl)")?;
    if !out.status.success() {
        bail!("openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(out.stdout)
}

pub fn b64url(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |acc, (i, b)| acc | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(ABC[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

pub struct Pki {
    pub dir: PathBuf,
    pub tls: DownstreamTls,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// The JWKS Envoy verifies tokens with.
    pub jwks: String,
}

/// A CA, a server certificate for 127.0.0.1, a client certificate naming
/// `spiffe://fleet/team-mtls`, and an RS256 JWT key; all made now, in a fresh directory.
pub fn make_pki() -> Result<Pki> {
    let dir = std::env::temp_dir().join(format!("kvroute-e2e-pki-{}-{}", std::process::id(), MADE.fetch_add(1, Ordering::Relaxed)));
    std::fs::create_dir_all(&dir)?;
    openssl(&dir, &["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "1", "-subj", "/CN=kvroute test CA"])?;
    for (name, subject, san) in [("server", "/CN=127.0.0.1", "IP:127.0.0.1"), ("client", "/CN=team-mtls", "URI:spiffe://fleet/team-mtls")] {
        std::fs::write(dir.join(format!("{name}.ext")), format!("subjectAltName={san}\n"))?;
        openssl(&dir, &["req", "-newkey", "rsa:2048", "-nodes", "-keyout", &format!("{name}.key"), "-out", &format!("{name}.csr"), "-subj", subject])?;
        openssl(&dir, &[
            "x509", "-req", "-in", &format!("{name}.csr"), "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out",
            &format!("{name}.crt"), "-days", "1", "-extfile", &format!("{name}.ext"),
        ])?;
    }
    for key in ["jwt", "forger"] {
        openssl(&dir, &["genrsa", "-out", &format!("{key}.key"), "2048"])?;
    }
    let modulus = String::from_utf8(openssl(&dir, &["rsa", "-in", "jwt.key", "-noout", "-modulus"])?)?;
    let hex = modulus.trim().strip_prefix("Modulus=").context("openssl -modulus output")?;
    let n: Vec<u8> = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16)).collect::<Result<_, _>>()?;
    let jwks = json!({ "keys": [{ "kty": "RSA", "alg": "RS256", "use": "sig", "kid": "k1", "n": b64url(&n), "e": "AQAB" }] }).to_string();
    Ok(Pki {
        tls: DownstreamTls { cert: dir.join("server.crt"), key: dir.join("server.key"), client_ca: dir.join("ca.crt") },
        client_cert: dir.join("client.crt"),
        client_key: dir.join("client.key"),
        jwks,
        dir,
    })
}

/// An RS256 JWT with `claims`, signed with `key` (`jwt`: the trusted one; `forger`: not).
pub fn jwt(pki: &Pki, key: &str, claims: &Value) -> Result<String> {
    let header = b64url(br#"{"alg":"RS256","typ":"JWT","kid":"k1"}"#);
    let input = format!("{header}.{}", b64url(claims.to_string().as_bytes()));
    let file = pki.dir.join("jwt-input");
    std::fs::write(&file, &input)?;
    let sig = openssl(&pki.dir, &["dgst", "-sha256", "-sign", &format!("{key}.key"), "jwt-input"])?;
    Ok(format!("{input}.{}", b64url(&sig)))
}

pub fn jwt_authn(jwks: &str) -> String {
    // allow_missing_or_failed: a missing or bad token is not an error here; it just names no
    // tenant (the filter reads only what jwt_authn verified into the metadata).
    format!(
        r#"          - name: envoy.filters.http.jwt_authn
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication
              providers:
                test:
                  issuer: kvroute-test
                  local_jwks: {{ inline_string: '{jwks}' }}
                  payload_in_metadata: jwt_payload
                  forward: true
              rules:
              - match: {{ prefix: "/" }}
                requires: {{ allow_missing_or_failed: {{}} }}"#
    )
}

