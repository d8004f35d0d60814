//! Redis over TLS with an ACL user: a throwaway CA and server certificate (rcgen) for a
//! `redis-server` that only listens with TLS and requires AUTH. Two replicas share picks
//! through it, one with the password in its `rediss://user:password@` URL, one with it in
//! `password_file`; a wrong password stops the start with the server's refusal (and never
//! shows the password); without `ca_file` the server's certificate is not trusted and the
//! shard stays down (verification is never skipped).

use super::support::*;
use kvroute_state::assign::AssignmentId;
use kvroute_state::config::Config;
use kvroute_state::store::redis::shards::ShardId;
use kvroute_state::store::redis::RedisStore;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use serde_json::json;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const USER: &str = "kvroute";
const PASSWORD: &str = "tls-test-password";

/// A TLS-only `redis-server` with an ACL user, and its certificates in a temp dir; both
/// removed on drop.
struct TlsRedis {
    port: u16,
    dir: PathBuf,
    child: Child,
}

impl TlsRedis {
    fn start() -> TlsRedis {
        let dir = std::env::temp_dir().join(format!("kvroute-tls-{}-{}", std::process::id(), free_port()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, "kvroute test CA");
        let ca = ca.self_signed(&ca_key).expect("CA cert");
        let server_key = KeyPair::generate().expect("server key");
        let mut server = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).expect("server params");
        server.distinguished_name.push(DnType::CommonName, "127.0.0.1");
        let server = server.signed_by(&server_key, &ca, &ca_key).expect("server cert");
        std::fs::write(dir.join("ca.pem"), ca.pem()).expect("write");
        std::fs::write(dir.join("server.pem"), server.pem()).expect("write");
        std::fs::write(dir.join("server.key"), server_key.serialize_pem()).expect("write");
        let port = free_port();
        let path = |f: &str| dir.join(f).to_string_lossy().into_owned();
        let password = format!(">{PASSWORD}");
        let child = Command::new("redis-server")
            .args(["--port", "0", "--tls-port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--tls-cert-file", &path("server.pem"), "--tls-key-file", &path("server.key"), "--tls-ca-cert-file", &path("ca.pem")])
            .args(["--tls-auth-clients", "no", "--user", USER, "on", &password, "~*", "&*", "+@all", "--user", "default", "off"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server installed (scripts/setup.sh)");
        let mut s = TlsRedis { port, dir, child };
        wait_until("the TLS port to listen", || {
            assert!(s.child.try_wait().expect("child").is_none(), "redis-server exited: is it built with TLS (`redis-server --tls-port`)?");
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        s
    }

    fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    fn url(&self, userinfo: &str) -> String {
        format!("rediss://{userinfo}@127.0.0.1:{}", self.port)
    }

    fn password_file(&self, name: &str, password: &str) -> PathBuf {
        let p = self.dir.join(name);
        std::fs::write(&p, format!("{password}\n")).expect("write");
        p
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn tls_config(replica: &str, url: String, ca: Option<&Path>, password_file: Option<PathBuf>) -> Config {
    let mut c = redis_config(&[], replica, 1);
    c.redis.urls = vec![url];
    c.redis.ca_file = ca.map(Path::to_path_buf);
    c.redis.password_file = password_file;
    c.redis.timeout_ms = 1_000;
    plain_workers(&mut c, 2);
    c
}

fn connect(config: &Config) -> Result<std::sync::Arc<RedisStore>, String> {
    let rt = client_rt();
    rt.block_on(RedisStore::connect(config)).map_err(|e| e.to_string())
}

#[test]
fn replicas_share_state_over_tls_with_an_acl_user() {
    let server = TlsRedis::start();
    let inline = Replica::start(tls_config("tls-a", server.url(&format!("{USER}:{PASSWORD}")), Some(&server.ca()), None));
    let from_file = Replica::start(tls_config("tls-b", server.url(USER), Some(&server.ca()), Some(server.password_file("pw", PASSWORD))));
    let replicas = [&inline, &from_file];
    wait_until("both subscribed over TLS", || replicas.iter().all(|r| r.store.stats.resyncs.load(std::sync::atomic::Ordering::Relaxed) >= 1 && !r.store.degraded()));
    let rt = client_rt();
    let (status, resp) = post_json(&rt, &inline.url("/v1/pick"), json!({ "model": "m", "token_keys": [1, 2], "block_size": 16, "prompt_tokens": 32 }));
    assert_eq!((status, &resp["degraded_reason"]), (200, &json!("")), "{resp}");
    let id = resp["assignment_id"].as_u64().expect("id");
    wait_until("the pick to replicate over TLS", || from_file.state.fleet.assignments().contains(AssignmentId(id)));
    let m = rt.block_on(async { reqwest::get(inline.url("/metrics")).await.expect("up").text().await.expect("text") });
    assert!(!m.contains(PASSWORD) && m.contains(&format!("rediss://{USER}:***@")), "passwords redacted in metrics");

    // A wrong password (file): the start fails, naming the refusal, not the password.
    let wrong = tls_config("tls-c", server.url(USER), Some(&server.ca()), Some(server.password_file("bad", "not-the-password")));
    let err = connect(&wrong).err().expect("a wrong password stops the start");
    assert!(err.contains("credentials refused") && !err.contains("not-the-password"), "{err}");
    // No password at all for an ACL-only server: refused too.
    let none = tls_config("tls-d", server.url(USER), Some(&server.ca()), None);
    assert!(connect(&none).is_err_and(|e| e.contains("credentials refused")));

    // The system roots do not know the test CA: the shard is unreachable, never trusted blindly.
    let untrusted = tls_config("tls-e", server.url(&format!("{USER}:{PASSWORD}")), None, None);
    let store = connect(&untrusted).expect("an untrusted server is an outage, not a config error");
    assert!(!store.shards.is_up(ShardId(0)) && store.degraded(), "certificate not verified: shard down");
}
