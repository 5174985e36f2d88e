//! End-to-end tests of the proxy: a real Unix socket in a tempdir, a test
//! upstream on 127.0.0.1, and fake resolvers. Nothing here connects
//! anywhere but loopback: names of private or public addresses come from
//! the fake resolvers and are refused before any connection is attempted.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::{JoinHandle, JoinSet};

use super::*;

const WAIT: Duration = Duration::from_secs(10);
const LOCALHOST: &str = "127.0.0.1";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// What the test upstream does on each connection.
#[derive(Clone, Copy)]
enum Behaviour {
    /// Reads a request head, records it, answers this, closes.
    Http(&'static [u8]),
    /// Reads this many bytes, records them, answers this, closes.
    Exchange(usize, &'static [u8]),
    /// Writes without end.
    Flood,
    /// Reads and records until EOF; says nothing.
    Sink,
}

/// A TCP server on 127.0.0.1:0. Dropping it stops it and its connections.
struct Upstream {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    received: Arc<Mutex<Vec<Vec<u8>>>>,
    task: JoinHandle<()>,
}

impl Upstream {
    async fn start(behaviour: Behaviour) -> Upstream {
        let listener = TcpListener::bind((LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let received = Arc::new(Mutex::new(Vec::new()));
        let (acc, rec) = (accepted.clone(), received.clone());
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                acc.fetch_add(1, Ordering::SeqCst);
                let rec = rec.clone();
                connections.spawn(async move {
                    let mut got = Vec::new();
                    let mut buf = [0u8; 4096];
                    match behaviour {
                        Behaviour::Http(response) => {
                            while super::http::head_len(&got).is_none() {
                                match stream.read(&mut buf).await {
                                    Ok(0) | Err(_) => break,
                                    Ok(n) => got.extend_from_slice(&buf[..n]),
                                }
                            }
                            rec.lock().unwrap().push(got);
                            let _ = stream.write_all(response).await;
                        }
                        Behaviour::Exchange(len, reply) => {
                            got.resize(len, 0);
                            if stream.read_exact(&mut got).await.is_ok() {
                                rec.lock().unwrap().push(got);
                                let _ = stream.write_all(reply).await;
                            }
                        }
                        Behaviour::Flood => {
                            let chunk = vec![b'x'; 64 * 1024];
                            while stream.write_all(&chunk).await.is_ok() {}
                        }
                        Behaviour::Sink => {
                            loop {
                                match stream.read(&mut buf).await {
                                    Ok(0) | Err(_) => break,
                                    Ok(n) => got.extend_from_slice(&buf[..n]),
                                }
                            }
                            rec.lock().unwrap().push(got);
                        }
                    }
                });
            }
        });
        Upstream {
            addr,
            accepted,
            received,
            task,
        }
    }

    fn port(&self) -> u16 {
        self.addr.port()
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    fn received(&self) -> Vec<Vec<u8>> {
        self.received.lock().unwrap().clone()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A policy for tests: loopback let through, no own addresses, roomy caps.
fn policy(allow: &[String], resolver: Resolver) -> EgressPolicy {
    EgressPolicy {
        allow: Allowlist::parse(allow).unwrap(),
        max_bytes: 1 << 20,
        max_connections: 100,
        max_concurrent: 8,
        connect_timeout: Duration::from_secs(2),
        idle_timeout: Duration::from_secs(5),
        resolver,
        own: Vec::new(),
        allow_loopback_for_tests: true,
    }
}

/// `allowed.test` → 127.0.0.1, `priv.test` → 10.1.2.3, `link.test` →
/// 169.254.169.254, `mixed.test` → 127.0.0.1 and 10.0.0.1.
fn resolver() -> Resolver {
    Resolver::fixed([
        ("allowed.test", vec![ip(LOCALHOST)]),
        ("priv.test", vec![ip("10.1.2.3")]),
        ("link.test", vec![ip("169.254.169.254")]),
        ("mixed.test", vec![ip(LOCALHOST), ip("10.0.0.1")]),
    ])
}

/// The proxy on a socket in a tempdir.
struct Proxy {
    path: PathBuf,
    handle: Option<EgressHandle>,
    events: UnboundedReceiver<EgressEvent>,
    _dir: tempfile::TempDir,
}

impl Proxy {
    fn start(policy: EgressPolicy) -> Proxy {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("egress.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let (handle, events) = EgressHandle::start(listener, Arc::new(policy));
        Proxy {
            path,
            handle: Some(handle),
            events,
            _dir: dir,
        }
    }

    async fn connect(&self) -> UnixStream {
        UnixStream::connect(&self.path).await.unwrap()
    }

    /// A new connection on which a CONNECT to `host:port` was established.
    async fn tunnel(&self, host: &str, port: u16) -> UnixStream {
        let mut stream = self.connect().await;
        stream
            .write_all(&connect_request(host, port))
            .await
            .unwrap();
        assert_eq!(read_head(&mut stream).await, ESTABLISHED);
        stream
    }

    /// Sends `request` on a new connection and reads the answer to EOF.
    async fn exchange(&self, request: &[u8]) -> String {
        let mut stream = self.connect().await;
        stream.write_all(request).await.unwrap();
        read_to_end(&mut stream).await
    }

    async fn next_event(&mut self) -> EgressEvent {
        tokio::time::timeout(WAIT, self.events.recv())
            .await
            .expect("an event in time")
            .expect("the proxy is running")
    }

    fn totals(&self) -> EgressTotals {
        self.handle.as_ref().unwrap().totals()
    }

    /// Stops the proxy; the final totals and the events not yet read.
    async fn stop(mut self) -> (EgressTotals, Vec<EgressEvent>) {
        let handle = self.handle.take().unwrap();
        let totals = tokio::time::timeout(WAIT, handle.stop())
            .await
            .expect("the proxy stops in time");
        let mut rest = Vec::new();
        while let Ok(event) = self.events.try_recv() {
            rest.push(event);
        }
        (totals, rest)
    }
}

async fn read_to_end(stream: &mut UnixStream) -> String {
    let mut out = Vec::new();
    tokio::time::timeout(WAIT, stream.read_to_end(&mut out))
        .await
        .expect("EOF in time")
        .unwrap();
    String::from_utf8(out).unwrap()
}

/// Reads a response head, byte by byte so as not to read past it.
async fn read_head(stream: &mut UnixStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    tokio::time::timeout(WAIT, async {
        while !head.ends_with(b"\r\n\r\n") {
            if stream.read(&mut byte).await.unwrap() == 0 {
                break;
            }
            head.push(byte[0]);
        }
    })
    .await
    .expect("a response head in time");
    String::from_utf8(head).unwrap()
}

fn connect_request(host: &str, port: u16) -> Vec<u8> {
    format!("CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n").into_bytes()
}

const ESTABLISHED: &str = "HTTP/1.1 200 Connection established\r\n\r\n";

fn refused(event: &EgressEvent, reason: &str) {
    assert!(!event.allowed, "{event:?}");
    assert_eq!(event.reason.as_deref(), Some(reason), "{event:?}");
    assert_eq!((event.bytes_up, event.bytes_down), (0, 0), "{event:?}");
}

mod forwarding;
mod limits;
mod refusals;
