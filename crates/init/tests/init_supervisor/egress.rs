//! The egress relay: a stage reaches the Unix socket of the bundle's
//! `egress` through `127.0.0.1:<listen_port>`, from the first stage on; a
//! relay that cannot be set up is fatal before anything runs.
//!
//! The "proxy" is a Unix socket server of the test in a tempdir; the stage
//! is python3, which connects, sends a line, shuts down its writing half
//! and prints what comes back until the end of stream.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use code_runner_protocol::{EgressRelay, HostMessage, StageSpec};

use super::harness::Sandbox;

const T: Duration = Duration::from_secs(20);

/// Connects to the port in argv[1], sends argv[2] and a newline, shuts
/// down writing, prints what it got until the end of stream (or the
/// error that ended it).
const CLIENT: &str = r#"
import socket, sys
try:
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
    s.sendall(sys.argv[2].encode() + b"\n")
    s.shutdown(socket.SHUT_WR)
    data = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    print("answer:", data.decode(), end="")
except OSError as e:
    print("error:", type(e).__name__)
"#;

/// A port nothing listens on (just now).
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

fn client_stage(sb: &Sandbox, name: &str, port: u16, message: &str) -> StageSpec {
    sb.stage(name, &["python3", "-c", CLIENT, &port.to_string(), message])
}

fn with_egress(bundle: HostMessage, egress: EgressRelay) -> HostMessage {
    let HostMessage::Bundle(mut bundle) = bundle else {
        unreachable!()
    };
    bundle.egress = Some(egress);
    HostMessage::Bundle(bundle)
}

/// The proxy: accepts `count` connections one after the other, reads each
/// request to its end and answers `proxy got: <request>`; returns the
/// requests. Gives up (and panics) after [`T`].
fn proxy(path: &Path, count: usize) -> JoinHandle<Vec<String>> {
    let listener = UnixListener::bind(path).unwrap();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let deadline = Instant::now() + T;
        let mut requests = Vec::new();
        while requests.len() < count {
            let mut stream = match listener.accept() {
                Ok((stream, _)) => stream,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    assert!(Instant::now() < deadline, "no connection came");
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                Err(e) => panic!("accept: {e}"),
            };
            stream.set_nonblocking(false).unwrap();
            stream.set_read_timeout(Some(T)).unwrap();
            let mut request = String::new();
            stream.read_to_string(&mut request).unwrap();
            stream
                .write_all(format!("proxy got: {request}").as_bytes())
                .unwrap();
            requests.push(request);
        }
        requests
    })
}

fn socket_in(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("proxy.sock")
}

#[test]
fn every_stage_reaches_the_socket_through_the_relay() {
    let dir = tempfile::tempdir().unwrap();
    let socket = socket_in(&dir);
    let server = proxy(&socket, 2);
    let port = free_port();
    let mut sb = Sandbox::start();
    let stages = vec![
        client_stage(&sb, "compile", port, "first stage"),
        client_stage(&sb, "run", port, "CONNECT example.test:443 HTTP/1.1"),
    ];
    let bundle = with_egress(
        sb.bundle(vec![], stages),
        EgressRelay {
            listen_port: port,
            socket: socket.to_string_lossy().into_owned(),
            max_concurrent: 4,
        },
    );
    sb.send(bundle);
    let outcome = sb.finish(T);
    assert!(outcome.done, "{outcome:?}");
    assert_eq!(outcome.exit_code, Some(0), "{outcome:?}");
    assert_eq!(outcome.reports.len(), 2, "{outcome:?}");
    assert_eq!(
        outcome.stdout_text(),
        "answer: proxy got: first stage\nanswer: proxy got: CONNECT example.test:443 HTTP/1.1\n",
        "stderr: {}",
        String::from_utf8_lossy(&outcome.stderr)
    );
    assert_eq!(
        server.join().unwrap(),
        ["first stage\n", "CONNECT example.test:443 HTTP/1.1\n"]
    );
}

#[test]
fn without_the_proxy_the_connection_is_closed_and_the_job_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut sb = Sandbox::start();
    let stages = vec![client_stage(&sb, "run", port, "anyone?")];
    let bundle = with_egress(
        sb.bundle(vec![], stages),
        EgressRelay {
            listen_port: port,
            socket: socket_in(&dir).to_string_lossy().into_owned(),
            max_concurrent: 1,
        },
    );
    sb.send(bundle);
    let outcome = sb.finish(T);
    assert_eq!(outcome.only_report().exit_code, Some(0), "{outcome:?}");
    // Closed at once: the end of stream, or a reset (which fails the
    // recv, or the shutdown before it); not the client's timeout.
    let stdout = outcome.stdout_text();
    assert!(
        stdout == "answer: " || (stdout.starts_with("error: ") && !stdout.contains("Timeout")),
        "{stdout:?}"
    );
    assert!(
        outcome.diagnostics.contains("egress relay: cannot connect"),
        "{}",
        outcome.diagnostics
    );
}

/// Runs a bundle with `egress` and one stage that must not start; returns
/// the fatal message.
fn fatal_with(egress: EgressRelay) -> String {
    let mut sb = Sandbox::start();
    let stage = sb.stage("run", &["echo", "ran"]);
    sb.send(with_egress(sb.bundle(vec![], vec![stage]), egress));
    let outcome = sb.finish(T);
    assert_eq!(outcome.exit_code, Some(70), "{outcome:?}");
    assert!(outcome.starts.is_empty(), "{outcome:?}");
    assert!(!outcome.done);
    outcome.fatal.expect("a fatal frame")
}

#[test]
fn an_invalid_egress_relay_is_fatal_naming_the_field() {
    let valid = EgressRelay {
        listen_port: free_port(),
        socket: "/run/code-runner/egress/proxy.sock".into(),
        max_concurrent: 4,
    };
    let cases = [
        (
            EgressRelay {
                listen_port: 0,
                ..valid.clone()
            },
            "egress.listen_port",
        ),
        (
            EgressRelay {
                socket: "proxy.sock".into(),
                ..valid.clone()
            },
            "egress.socket \"proxy.sock\" is not an absolute path",
        ),
        (
            EgressRelay {
                socket: format!("/{}", "s".repeat(200)),
                ..valid.clone()
            },
            "egress.socket",
        ),
        (
            EgressRelay {
                max_concurrent: 0,
                ..valid.clone()
            },
            "egress.max_concurrent",
        ),
    ];
    for (egress, needle) in cases {
        let fatal = fatal_with(egress);
        assert!(
            fatal.starts_with("invalid bundle: ") && fatal.contains(needle),
            "{needle}: {fatal}"
        );
    }
}

#[test]
fn a_port_already_in_use_is_fatal_naming_it() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let fatal = fatal_with(EgressRelay {
        listen_port: port,
        socket: "/run/code-runner/egress/proxy.sock".into(),
        max_concurrent: 4,
    });
    assert!(
        fatal.starts_with(&format!(
            "cannot listen for the egress relay on 127.0.0.1:{port}: "
        )),
        "{fatal}"
    );
    drop(taken);
}
