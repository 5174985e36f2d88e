//! Name resolution for the proxy: the system resolver in the daemon, fixed
//! or scripted answers in tests (which never resolve a real name).

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Where addresses come from. The proxy resolves each connection's host
/// once and connects to what it got (see the module docs).
#[derive(Debug)]
pub enum Resolver {
    /// `tokio::net::lookup_host` (getaddrinfo, on the blocking pool).
    System,
    /// Fixed answers by host name (lowercase); an unknown name fails as
    /// "not found". For tests.
    Static(HashMap<String, Vec<IpAddr>>),
    /// One queued answer per lookup, whatever the name; fails once the
    /// queue is empty. Counts lookups. For tests.
    Scripted(Arc<Scripted>),
}

/// The answers of a [`Resolver::Scripted`], and the lookups made.
#[derive(Debug, Default)]
pub struct Scripted {
    answers: Mutex<VecDeque<Vec<IpAddr>>>,
    lookups: Mutex<Vec<String>>,
    calls: AtomicUsize,
}

impl Scripted {
    /// Answers given in order, one per lookup.
    pub fn new(answers: impl IntoIterator<Item = Vec<IpAddr>>) -> Arc<Scripted> {
        Arc::new(Scripted {
            answers: Mutex::new(answers.into_iter().collect()),
            ..Scripted::default()
        })
    }

    /// How many lookups were made.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// The names looked up, in order.
    pub fn lookups(&self) -> Vec<String> {
        self.lookups
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn next(&self, host: &str) -> io::Result<Vec<IpAddr>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.lookups
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(host.to_owned());
        self.answers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no scripted answer left"))
    }
}

impl Resolver {
    /// A [`Resolver::Static`] from `(name, addresses)` pairs.
    pub fn fixed<'a>(pairs: impl IntoIterator<Item = (&'a str, Vec<IpAddr>)>) -> Resolver {
        Resolver::Static(
            pairs
                .into_iter()
                .map(|(host, ips)| (host.to_ascii_lowercase(), ips))
                .collect(),
        )
    }

    /// The addresses of `host` (already normalized: lowercase, no trailing
    /// dot), deduplicated, in the resolver's order.
    pub async fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<IpAddr>> {
        let ips = match self {
            Resolver::System => tokio::net::lookup_host((host, port))
                .await?
                .map(|sa| sa.ip())
                .collect(),
            Resolver::Static(map) => map.get(host).cloned().ok_or_else(|| {
                io::Error::new(io::ErrorKind::NotFound, "no such host (static resolver)")
            })?,
            Resolver::Scripted(script) => script.next(host)?,
        };
        let mut out: Vec<IpAddr> = Vec::with_capacity(ips.len());
        for ip in ips {
            if !out.contains(&ip) {
                out.push(ip);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn static_answers_by_name() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let r = Resolver::fixed([("Allowed.test", vec![lo, lo])]);
        assert_eq!(r.resolve("allowed.test", 80).await.unwrap(), vec![lo]);
        let e = r.resolve("other.test", 80).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }

    #[tokio::test]
    async fn scripted_answers_in_order_and_counts() {
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.1".parse().unwrap();
        let script = Scripted::new([vec![a], vec![b]]);
        let r = Resolver::Scripted(script.clone());
        assert_eq!(r.resolve("x.test", 1).await.unwrap(), vec![a]);
        assert_eq!(r.resolve("y.test", 1).await.unwrap(), vec![b]);
        assert!(r.resolve("z.test", 1).await.is_err());
        assert_eq!(script.calls(), 3);
        assert_eq!(script.lookups(), vec!["x.test", "y.test", "z.test"]);
    }
}
