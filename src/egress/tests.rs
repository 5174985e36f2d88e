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

#[tokio::test]
async fn connect_relays_both_ways_with_exact_counts() {
    let upstream = Upstream::start(Behaviour::Exchange(4, b"pong!")).await;
    let port = upstream.port();
    let mut proxy = Proxy::start(policy(&[format!("allowed.test:{port}")], resolver()));

    let mut client = proxy.connect().await;
    client
        .write_all(&connect_request("Allowed.Test", port))
        .await
        .unwrap();
    assert_eq!(read_head(&mut client).await, ESTABLISHED);
    client.write_all(b"ping").await.unwrap();
    assert_eq!(read_to_end(&mut client).await, "pong!");
    drop(client);

    let event = proxy.next_event().await;
    assert_eq!(
        event,
        EgressEvent {
            host: "allowed.test".into(),
            port,
            address: Some(ip(LOCALHOST)),
            allowed: true,
            reason: None,
            bytes_up: 4,
            bytes_down: 5,
        }
    );
    assert_eq!(upstream.received(), vec![b"ping".to_vec()]);

    // Bytes sent right behind the CONNECT head are relayed too.
    let mut client = proxy.connect().await;
    let mut request = connect_request("allowed.test", port);
    request.extend_from_slice(b"pi");
    client.write_all(&request).await.unwrap();
    assert_eq!(read_head(&mut client).await, ESTABLISHED);
    client.write_all(b"ng").await.unwrap();
    assert_eq!(read_to_end(&mut client).await, "pong!");
    drop(client);
    let event = proxy.next_event().await;
    assert_eq!((event.bytes_up, event.bytes_down), (4, 5));

    let (totals, rest) = proxy.stop().await;
    assert!(rest.is_empty());
    assert_eq!(
        totals,
        EgressTotals {
            bytes_up: 8,
            bytes_down: 10,
            connections: 2,
            refused: 0
        }
    );
}

#[tokio::test]
async fn plain_http_is_forwarded_in_origin_form() {
    const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";
    let upstream = Upstream::start(Behaviour::Http(RESPONSE)).await;
    let port = upstream.port();
    let mut proxy = Proxy::start(policy(&[format!("allowed.test:{port}")], resolver()));

    let request = format!(
        "GET http://allowed.test:{port}/x?y=1 HTTP/1.1\r\n\
         Host: elsewhere.test\r\n\
         Proxy-Connection: keep-alive\r\n\
         Proxy-Authorization: Basic eDp5\r\n\
         User-Agent: test\r\n\r\n"
    );
    let answer = proxy.exchange(request.as_bytes()).await;
    assert_eq!(answer.as_bytes(), RESPONSE);

    let sent = format!(
        "GET /x?y=1 HTTP/1.1\r\nHost: allowed.test:{port}\r\nUser-Agent: test\r\nConnection: close\r\n\r\n"
    );
    assert_eq!(upstream.received(), vec![sent.clone().into_bytes()]);
    let event = proxy.next_event().await;
    assert!(event.allowed, "{event:?}");
    assert_eq!(event.reason, None);
    assert_eq!(event.address, Some(ip(LOCALHOST)));
    assert_eq!(event.bytes_up, sent.len() as u64);
    assert_eq!(event.bytes_down, RESPONSE.len() as u64);
    proxy.stop().await;
}

#[tokio::test]
async fn hosts_and_ports_not_in_the_allowlist_are_refused() {
    let upstream = Upstream::start(Behaviour::Sink).await;
    let port = upstream.port();
    let mut proxy = Proxy::start(policy(&[format!("allowed.test:{port}")], resolver()));

    let answer = proxy.exchange(&connect_request("other.test", port)).await;
    assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{answer}");
    assert!(
        answer.ends_with("\r\n\r\negress: other.test is not in the job's allowlist\n"),
        "{answer}"
    );
    let event = proxy.next_event().await;
    refused(&event, reason::NOT_ALLOWED);
    assert_eq!(
        (event.host.as_str(), event.port, event.address),
        ("other.test", port, None)
    );

    let answer = proxy.exchange(&connect_request("allowed.test", 443)).await;
    assert!(
        answer.contains("egress: port 443 of allowed.test is not in the job's allowlist"),
        "{answer}"
    );
    refused(&proxy.next_event().await, reason::NOT_ALLOWED);

    // An IP literal is never an allowed host, loopback switch or not.
    let answer = proxy.exchange(&connect_request(LOCALHOST, port)).await;
    assert!(answer.starts_with("HTTP/1.1 403 "), "{answer}");
    refused(&proxy.next_event().await, reason::NOT_ALLOWED);
    let get = format!("GET http://[::1]:{port}/ HTTP/1.1\r\n\r\n");
    assert!(
        proxy
            .exchange(get.as_bytes())
            .await
            .starts_with("HTTP/1.1 403 ")
    );
    refused(&proxy.next_event().await, reason::NOT_ALLOWED);

    assert_eq!(upstream.accepted(), 0);
    let (totals, _) = proxy.stop().await;
    assert_eq!((totals.connections, totals.refused), (4, 4));
}

#[tokio::test]
async fn private_and_link_local_addresses_are_refused_without_connecting() {
    let upstream = Upstream::start(Behaviour::Sink).await;
    let allow = ["priv.test".to_string(), "link.test".to_string()];
    let mut proxy = Proxy::start(policy(&allow, resolver()));

    let answer = proxy.exchange(&connect_request("priv.test", 443)).await;
    assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{answer}");
    assert!(
        answer.ends_with("egress: priv.test resolves to 10.1.2.3 (private); refused\n"),
        "{answer}"
    );
    let event = proxy.next_event().await;
    refused(&event, reason::FORBIDDEN_ADDRESS);
    assert_eq!(event.address, Some(ip("10.1.2.3")));

    let get = b"GET http://link.test/latest/meta-data/ HTTP/1.1\r\nHost: link.test\r\n\r\n";
    let answer = proxy.exchange(get).await;
    assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{answer}");
    assert!(
        answer.contains("resolves to 169.254.169.254 (link-local); refused"),
        "{answer}"
    );
    let event = proxy.next_event().await;
    refused(&event, reason::FORBIDDEN_ADDRESS);
    assert_eq!((event.host.as_str(), event.port), ("link.test", 80));

    assert_eq!(upstream.accepted(), 0);
    proxy.stop().await;
}

#[tokio::test]
async fn loopback_is_refused_without_the_test_switch() {
    let upstream = Upstream::start(Behaviour::Sink).await;
    let port = upstream.port();
    let mut p = policy(&[format!("allowed.test:{port}")], resolver());
    p.allow_loopback_for_tests = false;
    let mut proxy = Proxy::start(p);

    let answer = proxy.exchange(&connect_request("allowed.test", port)).await;
    assert!(
        answer.contains("egress: allowed.test resolves to 127.0.0.1 (loopback); refused"),
        "{answer}"
    );
    refused(&proxy.next_event().await, reason::FORBIDDEN_ADDRESS);
    assert_eq!(upstream.accepted(), 0);
    proxy.stop().await;
}

#[tokio::test]
async fn own_addresses_are_refused() {
    // A public address standing for the machine's own; never connected to.
    let mut p = policy(
        &["mine.test".to_string()],
        Resolver::fixed([("mine.test", vec![ip("8.8.4.4")])]),
    );
    p.own = vec![ip("8.8.4.4")];
    let mut proxy = Proxy::start(p);
    let answer = proxy.exchange(&connect_request("mine.test", 443)).await;
    assert!(
        answer.contains("resolves to 8.8.4.4 (own address); refused"),
        "{answer}"
    );
    refused(&proxy.next_event().await, reason::FORBIDDEN_ADDRESS);
    proxy.stop().await;
}

#[tokio::test]
async fn any_forbidden_address_in_the_answer_refuses() {
    let upstream = Upstream::start(Behaviour::Sink).await;
    let port = upstream.port();
    let mut proxy = Proxy::start(policy(&[format!("mixed.test:{port}")], resolver()));
    let answer = proxy.exchange(&connect_request("mixed.test", port)).await;
    assert!(
        answer.contains("resolves to 10.0.0.1 (private); refused"),
        "{answer}"
    );
    let event = proxy.next_event().await;
    refused(&event, reason::FORBIDDEN_ADDRESS);
    assert_eq!(event.address, Some(ip("10.0.0.1")));
    assert_eq!(upstream.accepted(), 0);
    proxy.stop().await;
}

#[tokio::test]
async fn the_resolver_is_consulted_once_per_connection_and_pinned() {
    let upstream = Upstream::start(Behaviour::Exchange(1, b"!")).await;
    let port = upstream.port();
    let script = Scripted::new([vec![ip(LOCALHOST)], vec![ip("10.0.0.1")]]);
    let mut proxy = Proxy::start(policy(
        &[format!("rebind.test:{port}")],
        Resolver::Scripted(script.clone()),
    ));

    // The first answer is loopback (let through here); the connection goes
    // there, and the second answer is not consulted for it.
    let mut client = proxy.connect().await;
    client
        .write_all(&connect_request("rebind.test", port))
        .await
        .unwrap();
    assert_eq!(read_head(&mut client).await, ESTABLISHED);
    assert_eq!(script.calls(), 1);
    client.write_all(b"?").await.unwrap();
    assert_eq!(read_to_end(&mut client).await, "!");
    drop(client);
    let event = proxy.next_event().await;
    assert!(event.allowed);
    assert_eq!(event.address, Some(ip(LOCALHOST)));
    assert_eq!(script.calls(), 1);

    // The next connection resolves again, and gets the private answer.
    let answer = proxy.exchange(&connect_request("rebind.test", port)).await;
    assert!(
        answer.contains("resolves to 10.0.0.1 (private); refused"),
        "{answer}"
    );
    refused(&proxy.next_event().await, reason::FORBIDDEN_ADDRESS);
    assert_eq!(script.calls(), 2);
    assert_eq!(script.lookups(), vec!["rebind.test", "rebind.test"]);
    assert_eq!(upstream.accepted(), 1);
    proxy.stop().await;
}

#[tokio::test]
async fn the_byte_cap_ends_a_download_flood_and_refuses_new_connections() {
    const CAP: u64 = 100_000;
    let upstream = Upstream::start(Behaviour::Flood).await;
    let port = upstream.port();
    let mut p = policy(&[format!("allowed.test:{port}")], resolver());
    p.max_bytes = CAP;
    let mut proxy = Proxy::start(p);

    let mut client = proxy.connect().await;
    client
        .write_all(&connect_request("allowed.test", port))
        .await
        .unwrap();
    assert_eq!(read_head(&mut client).await, ESTABLISHED);
    let got = read_to_end(&mut client).await;
    let event = proxy.next_event().await;
    assert!(event.allowed);
    assert_eq!(event.reason.as_deref(), Some(reason::BYTE_CAP), "{event:?}");
    assert!(event.bytes_down <= CAP, "{event:?}");
    assert_eq!(event.bytes_down, got.len() as u64);
    assert_eq!(event.bytes_up, 0);

    let answer = proxy.exchange(&connect_request("allowed.test", port)).await;
    assert!(
        answer.starts_with("HTTP/1.1 429 Too Many Requests\r\n"),
        "{answer}"
    );
    refused(&proxy.next_event().await, reason::BYTE_CAP);
    let (totals, _) = proxy.stop().await;
    assert!(totals.bytes_down <= CAP);
    assert_eq!(upstream.accepted(), 1);
}

#[tokio::test]
async fn the_byte_cap_ends_an_upload_flood() {
    const CAP: u64 = 50_000;
    let upstream = Upstream::start(Behaviour::Sink).await;
    let port = upstream.port();
    let mut p = policy(&[format!("allowed.test:{port}")], resolver());
    p.max_bytes = CAP;
    let mut proxy = Proxy::start(p);

    let mut client = proxy.connect().await;
    client
        .write_all(&connect_request("allowed.test", port))
        .await
        .unwrap();
    assert_eq!(read_head(&mut client).await, ESTABLISHED);
    let chunk = vec![b'u'; 8192];
    let flood = tokio::time::timeout(WAIT, async {
        while client.write_all(&chunk).await.is_ok() {}
    });
    flood.await.expect("the proxy closes the flood");
    let event = proxy.next_event().await;
    assert_eq!(event.reason.as_deref(), Some(reason::BYTE_CAP), "{event:?}");
    assert!(event.bytes_up <= CAP, "{event:?}");
    drop(client);
    proxy.stop().await;
    // The upstream got what was counted, no more.
    tokio::time::timeout(WAIT, async {
        while upstream.received().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap();
    assert_eq!(upstream.received()[0].len() as u64, event.bytes_up);
}

#[tokio::test]
async fn the_connection_cap_answers_429() {
    let upstream = Upstream::start(Behaviour::Exchange(1, b"!")).await;
    let port = upstream.port();
    let mut p = policy(&[format!("allowed.test:{port}")], resolver());
    p.max_connections = 2;
    let mut proxy = Proxy::start(p);

    // A refused connection counts.
    assert!(
        proxy
            .exchange(&connect_request("other.test", port))
            .await
            .starts_with("HTTP/1.1 403 ")
    );
    refused(&proxy.next_event().await, reason::NOT_ALLOWED);
    let mut client = proxy.connect().await;
    client
        .write_all(&connect_request("allowed.test", port))
        .await
        .unwrap();
    assert_eq!(read_head(&mut client).await, ESTABLISHED);
    client.write_all(b"?").await.unwrap();
    assert_eq!(read_to_end(&mut client).await, "!");
    drop(client);
    assert!(proxy.next_event().await.allowed);

    for _ in 0..2 {
        let answer = proxy.exchange(&connect_request("allowed.test", port)).await;
        assert!(
            answer.starts_with("HTTP/1.1 429 Too Many Requests\r\n"),
            "{answer}"
        );
        refused(&proxy.next_event().await, reason::CONNECTION_CAP);
    }
    assert_eq!(upstream.accepted(), 1);
    let (totals, _) = proxy.stop().await;
    assert_eq!((totals.connections, totals.refused), (4, 3));
}

#[tokio::test]
async fn bad_requests() {
    let mut p = policy(&["allowed.test".to_string()], resolver());
    p.idle_timeout = Duration::from_millis(300);
    let mut proxy = Proxy::start(p);

    let answer = proxy
        .exchange(b"GET /x HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
        .await;
    assert!(
        answer.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"),
        "{answer}"
    );
    assert!(answer.contains("this is a proxy"), "{answer}");
    refused(&proxy.next_event().await, reason::BAD_REQUEST);

    for request in [
        &b"hello\r\n\r\n"[..],
        b"GET https://allowed.test/ HTTP/1.1\r\n\r\n",
        b"CONNECT allowed.test HTTP/1.1\r\n\r\n",
        b"GET http://allowed.test/ HTTP/1.1\r\nBad\nHeader: x\r\n\r\n",
    ] {
        let answer = proxy.exchange(request).await;
        assert!(
            answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
            "{answer}"
        );
        let event = proxy.next_event().await;
        refused(&event, reason::BAD_REQUEST);
        assert_eq!((event.host.as_str(), event.port), ("", 0));
    }

    // A head that never ends.
    let mut big = b"GET http://allowed.test/ HTTP/1.1\r\n".to_vec();
    while big.len() <= MAX_HEAD {
        big.extend_from_slice(b"X-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
    }
    let mut client = proxy.connect().await;
    let _ = client.write_all(&big).await;
    let answer = read_to_end(&mut client).await;
    assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
    refused(&proxy.next_event().await, reason::HEAD_TOO_LARGE);

    // A head that never comes.
    let mut client = proxy.connect().await;
    client
        .write_all(b"CONNECT allowed.test:443 HTTP/1.1\r\n")
        .await
        .unwrap();
    let answer = read_to_end(&mut client).await;
    assert!(
        answer.starts_with("HTTP/1.1 408 Request Timeout\r\n"),
        "{answer}"
    );
    refused(&proxy.next_event().await, reason::HEAD_TIMEOUT);
    proxy.stop().await;
}

#[tokio::test]
async fn dns_and_connect_failures_are_502() {
    // A loopback port nobody listens on.
    let closed = TcpListener::bind((LOCALHOST, 0)).await.unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    let allow = [format!("allowed.test:{closed_port}"), "gone.test".into()];
    let mut proxy = Proxy::start(policy(
        &allow,
        Resolver::Static(HashMap::from([(
            "allowed.test".to_string(),
            vec![ip(LOCALHOST)],
        )])),
    ));

    let answer = proxy.exchange(&connect_request("gone.test", 443)).await;
    assert!(
        answer.starts_with("HTTP/1.1 502 Bad Gateway\r\n"),
        "{answer}"
    );
    assert!(
        answer.contains("egress: gone.test could not be resolved"),
        "{answer}"
    );
    refused(&proxy.next_event().await, reason::DNS_FAILED);

    let answer = proxy
        .exchange(&connect_request("allowed.test", closed_port))
        .await;
    assert!(
        answer.starts_with("HTTP/1.1 502 Bad Gateway\r\n"),
        "{answer}"
    );
    assert!(
        answer.contains("egress: could not connect to allowed.test (127.0.0.1:"),
        "{answer}"
    );
    let event = proxy.next_event().await;
    refused(&event, reason::CONNECT_FAILED);
    assert_eq!(event.address, Some(ip(LOCALHOST)));
    proxy.stop().await;
}

#[tokio::test]
async fn an_idle_tunnel_is_closed() {
    let upstream = Upstream::start(Behaviour::Sink).await;
    let port = upstream.port();
    let mut p = policy(&[format!("allowed.test:{port}")], resolver());
    p.idle_timeout = Duration::from_millis(300);
    let mut proxy = Proxy::start(p);

    let mut client = proxy.connect().await;
    client
        .write_all(&connect_request("allowed.test", port))
        .await
        .unwrap();
    assert_eq!(read_head(&mut client).await, ESTABLISHED);
    client.write_all(b"abc").await.unwrap();
    assert_eq!(read_to_end(&mut client).await, "");
    let event = proxy.next_event().await;
    assert!(event.allowed);
    assert_eq!(event.reason.as_deref(), Some(reason::IDLE_TIMEOUT));
    assert_eq!((event.bytes_up, event.bytes_down), (3, 0));
    proxy.stop().await;
}

#[tokio::test]
async fn stop_ends_open_connections() {
    let upstream = Upstream::start(Behaviour::Sink).await;
    let port = upstream.port();
    let proxy = Proxy::start(policy(&[format!("allowed.test:{port}")], resolver()));

    let mut tunnel = proxy.connect().await;
    tunnel
        .write_all(&connect_request("allowed.test", port))
        .await
        .unwrap();
    assert_eq!(read_head(&mut tunnel).await, ESTABLISHED);
    // And one still sending its head.
    let mut slow = proxy.connect().await;
    slow.write_all(b"CONNECT allowed.test").await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;

    let (totals, events) = proxy.stop().await;
    assert_eq!(totals.connections, 2);
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(
        events
            .iter()
            .all(|e| e.reason.as_deref() == Some(reason::STOPPED)),
        "{events:?}"
    );
    assert_eq!(read_to_end(&mut tunnel).await, "");
    assert_eq!(read_to_end(&mut slow).await, "");
}

#[tokio::test]
async fn connections_past_max_concurrent_wait_their_turn() {
    let upstream = Upstream::start(Behaviour::Sink).await;
    let port = upstream.port();
    let mut p = policy(&[format!("allowed.test:{port}")], resolver());
    p.max_concurrent = 1;
    let mut proxy = Proxy::start(p);

    let mut first = proxy.connect().await;
    first
        .write_all(&connect_request("allowed.test", port))
        .await
        .unwrap();
    assert_eq!(read_head(&mut first).await, ESTABLISHED);

    let mut second = proxy.connect().await;
    second
        .write_all(&connect_request("allowed.test", port))
        .await
        .unwrap();
    let mut byte = [0u8; 1];
    let early = tokio::time::timeout(Duration::from_millis(200), second.read(&mut byte)).await;
    assert!(
        early.is_err(),
        "the second connection was served while the first was open"
    );

    drop(first);
    assert!(proxy.next_event().await.allowed);
    assert_eq!(read_head(&mut second).await, ESTABLISHED);
    drop(second);
    assert!(proxy.next_event().await.allowed);
    assert_eq!(proxy.totals().connections, 2);
    proxy.stop().await;
}

#[test]
fn events_serialize_with_their_field_names() {
    let event = EgressEvent {
        host: "pypi.org".into(),
        port: 443,
        address: Some(ip("151.101.0.223")),
        allowed: true,
        reason: None,
        bytes_up: 1,
        bytes_down: 2,
    };
    assert_eq!(
        serde_json::to_value(&event).unwrap(),
        serde_json::json!({
            "host": "pypi.org",
            "port": 443,
            "address": "151.101.0.223",
            "allowed": true,
            "reason": null,
            "bytes_up": 1,
            "bytes_down": 2,
        })
    );
}
