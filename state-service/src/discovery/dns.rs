//! DNS sources: an A/AAAA name (a Kubernetes headless Service: one address per ready pod) or
//! an SRV name (targets and ports), asked of the system resolver or a named server, without a
//! cache: the group's loop asks again when the answer's TTL runs out.

use hickory_resolver::config::{NameServerConfigGroup, ResolveHosts, ResolverConfig, ResolverOpts};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::{ResolveError, TokioResolver};
use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// The addresses a name stands for, and how long the answer holds.
#[derive(Debug, PartialEq)]
pub struct Answer {
    /// `host:port` pairs (an IPv6 host in brackets), sorted, distinct.
    pub addresses: BTreeSet<(String, u16)>,
    /// The smallest TTL of the records used; `None` for an empty answer.
    pub ttl: Option<Duration>,
}

pub struct Dns(TokioResolver);

impl Dns {
    /// A resolver asking `server` (UDP, then TCP), or the system's resolvers.
    pub fn new(server: Option<SocketAddr>) -> Result<Dns, ResolveError> {
        let provider = TokioConnectionProvider::default();
        let mut builder = match server {
            Some(addr) => {
                let servers = NameServerConfigGroup::from_ips_clear(&[addr.ip()], addr.port(), true);
                TokioResolver::builder_with_config(ResolverConfig::from_parts(None, vec![], servers), provider)
            }
            None => TokioResolver::builder(provider)?,
        };
        let opts: &mut ResolverOpts = builder.options_mut();
        // The loop re-asks on the TTL; a cache would only answer with what it already gave.
        opts.cache_size = 0;
        opts.timeout = Duration::from_secs(2);
        opts.attempts = 2;
        if server.is_some() {
            opts.use_hosts_file = ResolveHosts::Never;
        }
        Ok(Dns(builder.build()))
    }

    /// Every A and AAAA address of `name`, each serving on `port`. A name with no records
    /// (NXDOMAIN, NODATA: a Service scaled to zero) is an empty answer, not an error.
    pub async fn addresses(&self, name: &str, port: u16) -> Result<Answer, ResolveError> {
        let lookup = match self.0.lookup_ip(name).await {
            Ok(lookup) => lookup,
            Err(e) if e.is_no_records_found() || e.is_nx_domain() => return Ok(Answer { addresses: BTreeSet::new(), ttl: None }),
            Err(e) => return Err(e),
        };
        let ttl = lookup.as_lookup().records().iter().map(|r| r.ttl()).min().map(|s| Duration::from_secs(s.into()));
        let addresses = lookup.iter().map(|ip| (host(ip), port)).collect();
        Ok(Answer { addresses, ttl })
    }

    /// Every target of the SRV record `name`, at each of its addresses and the record's port.
    pub async fn services(&self, name: &str) -> Result<Answer, ResolveError> {
        let srv = match self.0.srv_lookup(name).await {
            Ok(srv) => srv,
            Err(e) if e.is_no_records_found() || e.is_nx_domain() => return Ok(Answer { addresses: BTreeSet::new(), ttl: None }),
            Err(e) => return Err(e),
        };
        let mut ttl = srv.as_lookup().records().iter().map(|r| r.ttl()).min().map(|s| Duration::from_secs(s.into()));
        let mut addresses = BTreeSet::new();
        for record in srv.iter() {
            let target = record.target().to_utf8();
            // A target without addresses serves nothing; a failed lookup fails the answer (so
            // the last good set stays), never drops the target.
            let found = self.addresses(&target, record.port()).await?;
            addresses.extend(found.addresses);
            ttl = match (ttl, found.ttl) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        Ok(Answer { addresses, ttl })
    }
}

/// An address as the host part of `host:port`.
fn host(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}
