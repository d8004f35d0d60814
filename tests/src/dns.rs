//! A real DNS server for discovery tests: `dnsmasq` (Debian `dnsmasq-base`) on a loopback
//! port, authoritative for `kvroute.test`, answering A records from a hosts file the test
//! rewrites ([`Dnsmasq::set_hosts`], applied by SIGHUP) and SRV records given at start
//! ([`Dnsmasq::restart`] changes them). Answers carry `ttl` seconds.

use crate::net::free_port;
use crate::proc::Proc;
use anyhow::{Context, Result};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub const DOMAIN: &str = "kvroute.test";

pub struct Dnsmasq {
    proc: Option<Proc>,
    pub port: u16,
    hosts: PathBuf,
    ttl: u32,
}

/// One SRV record: `name` served by `target` on `port`.
pub struct Srv<'a> {
    pub name: &'a str,
    pub target: &'a str,
    pub port: u16,
}

impl Dnsmasq {
    /// Starts dnsmasq with `hosts` (`(address, name)` pairs) and `srv` records.
    pub async fn start(hosts: &[(&str, &str)], srv: &[Srv<'_>], ttl: u32) -> Result<Dnsmasq> {
        let port = free_port();
        let path = std::env::temp_dir().join(format!("kvroute-e2e-hosts-{port}"));
        let mut dns = Dnsmasq { proc: None, port, hosts: path, ttl };
        dns.write_hosts(hosts)?;
        dns.restart(srv).await?;
        Ok(dns)
    }

    /// `127.0.0.1:port`, the server to name as a resolver.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    fn write_hosts(&self, hosts: &[(&str, &str)]) -> Result<()> {
        let text: String = hosts.iter().map(|(addr, name)| format!("{addr} {name}\n")).collect();
        // Renamed over the old file, so dnsmasq never reads half of it.
        let tmp = self.hosts.with_extension("new");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &self.hosts)?;
        Ok(())
    }

    /// Replaces the A records and has dnsmasq read them (SIGHUP).
    pub fn set_hosts(&self, hosts: &[(&str, &str)]) -> Result<()> {
        self.write_hosts(hosts)?;
        let pid = self.proc.as_ref().and_then(Proc::pid).context("dnsmasq not running")?;
        let status = std::process::Command::new("kill").args(["-HUP", &pid.to_string()]).status()?;
        anyhow::ensure!(status.success(), "kill -HUP {pid} failed");
        Ok(())
    }

    /// (Re)starts dnsmasq on the same port with these SRV records.
    pub async fn restart(&mut self, srv: &[Srv<'_>]) -> Result<()> {
        if let Some(mut p) = self.proc.take() {
            p.kill();
        }
        let user = std::env::var("USER").ok().filter(|u| !u.is_empty()).unwrap_or_else(|| "root".into());
        let mut args: Vec<String> = vec![
            "--keep-in-foreground".into(),
            "--log-facility=-".into(),
            "--conf-file=/dev/null".into(),
            format!("--port={}", self.port),
            "--listen-address=127.0.0.1".into(),
            "--bind-interfaces".into(),
            "--no-resolv".into(),
            "--no-hosts".into(),
            "--pid-file=".into(),
            format!("--user={user}"),
            format!("--local=/{DOMAIN}/"),
            format!("--addn-hosts={}", self.hosts.display()),
            format!("--local-ttl={}", self.ttl),
            "--log-queries".into(),
        ];
        args.extend(srv.iter().map(|s| format!("--srv-host={},{},{}", s.name, s.target, s.port)));
        let program = which("dnsmasq").context("dnsmasq not found (Debian dnsmasq-base; scripts/setup.sh installs it)")?;
        let mut proc = Proc::spawn("dnsmasq", &program, &args)?;
        // Up when it answers on its port.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            proc.check_alive()?;
            if std::net::UdpSocket::bind("127.0.0.1:0").and_then(|s| s.connect(self.addr()).map(|_| s)).is_ok()
                && proc.log_text().contains("read ")
            {
                break;
            }
            anyhow::ensure!(std::time::Instant::now() < deadline, "dnsmasq not up; log:\n{}", proc.log_tail(2000));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.proc = Some(proc);
        Ok(())
    }

    /// Stops the server: lookups fail until [`Dnsmasq::restart`].
    pub fn stop(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill();
        }
    }

    pub fn log_tail(&self) -> String {
        self.proc.as_ref().map(|p| p.log_tail(2000)).unwrap_or_default()
    }
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).chain(["/usr/sbin".into(), "/sbin".into()]).map(|d| d.join(name)).find(|p| p.is_file())
}
