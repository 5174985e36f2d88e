//! The egress relay's unit tests: real sockets on loopback and in a
//! temporary directory, a real relay thread.

use super::*;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;

const T: Duration = Duration::from_secs(10);

impl Relay {
    fn port(&self) -> u16 {
        self.probe.port
    }

    fn wakeups(&self) -> u64 {
        self.probe.wakeups.load(Ordering::Relaxed)
    }

    /// Stops the relay and waits for its thread to end.
    fn stop(self) {
        let Relay { _stop, probe } = self;
        drop(_stop);
        probe.thread.join().unwrap();
    }
}

/// A relay on a free port to `socket`.
fn relay(socket: &Path, max_concurrent: usize) -> Relay {
    Relay::spawn(listen(0).unwrap(), socket.to_path_buf(), max_concurrent).unwrap()
}

fn client(relay: &Relay) -> TcpStream {
    let stream = TcpStream::connect((Ipv4Addr::LOCALHOST, relay.port())).unwrap();
    stream.set_read_timeout(Some(T)).unwrap();
    stream.set_write_timeout(Some(T)).unwrap();
    stream
}

/// A socket path in a fresh directory (kept alive by the `TempDir`).
fn socket_path() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("proxy.sock");
    (dir, path)
}

/// A Unix socket server on `path` that accepts `count` connections,
/// each handled on a thread of its own; joining it joins them all (and
/// passes their panics on).
fn serve(
    path: &Path,
    count: usize,
    handler: impl Fn(UnixStream) + Send + Sync + 'static,
) -> JoinHandle<()> {
    let listener = UnixListener::bind(path).unwrap();
    let handler = Arc::new(handler);
    std::thread::spawn(move || {
        let mut handlers = Vec::new();
        for _ in 0..count {
            let (stream, _) = listener.accept().unwrap();
            stream.set_read_timeout(Some(T)).unwrap();
            stream.set_write_timeout(Some(T)).unwrap();
            let handler = handler.clone();
            handlers.push(std::thread::spawn(move || handler(stream)));
        }
        for handler in handlers {
            handler.join().unwrap();
        }
    })
}

/// Copies everything back until the end of stream, then closes.
fn echo(mut stream: UnixStream) {
    let mut buffer = vec![0; 32 * 1024];
    loop {
        let read = stream.read(&mut buffer).unwrap();
        if read == 0 {
            return;
        }
        stream.write_all(&buffer[..read]).unwrap();
    }
}

/// Answers each line with `echo: <line>` until the end of stream.
fn line_echo(stream: UnixStream) {
    let mut reader = io::BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    loop {
        let mut line = String::new();
        if io::BufRead::read_line(&mut reader, &mut line).unwrap() == 0 {
            return;
        }
        writer
            .write_all(format!("echo: {line}").as_bytes())
            .unwrap();
    }
}

/// `length` bytes of a sequence that does not repeat soon (xorshift).
fn pattern(length: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    (0..length)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

fn round_trip(stream: &mut TcpStream, line: &str) -> String {
    stream.write_all(line.as_bytes()).unwrap();
    let expected = format!("echo: {line}");
    let mut answer = vec![0; expected.len()];
    stream.read_exact(&mut answer).unwrap();
    String::from_utf8(answer).unwrap()
}

/// The relay closed the connection: end of stream or a reset, not a
/// timeout.
fn assert_closed(stream: &mut TcpStream) {
    let mut buffer = [0; 16];
    match stream.read(&mut buffer) {
        Ok(0) => {}
        Ok(read) => panic!("read {read} bytes from a connection that should be closed"),
        Err(error) => assert!(
            !matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
            "the connection was not closed: {error}"
        ),
    }
}

#[test]
fn bytes_pass_unchanged_both_ways() {
    let (_dir, path) = socket_path();
    let server = serve(&path, 1, echo);
    let relay = relay(&path, 4);
    let mut stream = client(&relay);
    for message in [&b"hello\n"[..], b"\0\x01\xff\xfe no newline", b"x"] {
        stream.write_all(message).unwrap();
        let mut answer = vec![0; message.len()];
        stream.read_exact(&mut answer).unwrap();
        assert_eq!(answer, message);
    }
    stream.shutdown(Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "{rest:?}");
    server.join().unwrap();
    relay.stop();
}

#[test]
fn megabytes_pass_both_ways_at_once_exactly() {
    let (_dir, path) = socket_path();
    let server = serve(&path, 1, echo);
    let relay = relay(&path, 4);
    let stream = client(&relay);
    // Not a multiple of the buffers, so that the last chunks are partial.
    let sent = pattern(6 * 1024 * 1024 + 12_345, 7);
    let writer = {
        let mut stream = stream.try_clone().unwrap();
        let sent = sent.clone();
        std::thread::spawn(move || {
            stream.write_all(&sent).unwrap();
            stream.shutdown(Shutdown::Write).unwrap();
        })
    };
    let mut received = Vec::new();
    (&stream).read_to_end(&mut received).unwrap();
    writer.join().unwrap();
    assert_eq!(received.len(), sent.len());
    assert!(received == sent, "the echoed bytes differ");
    server.join().unwrap();
    relay.stop();
}

#[test]
fn the_server_may_speak_first_and_close_its_half_first() {
    let (_dir, path) = socket_path();
    let greeting = pattern(3 * 1024 * 1024 + 1, 11);
    let request = pattern(2 * 1024 * 1024 + 3, 13);
    let (got_tx, got_rx) = mpsc::channel();
    let server = {
        let greeting = greeting.clone();
        serve(&path, 1, move |mut stream| {
            stream.write_all(&greeting).unwrap();
            stream.shutdown(Shutdown::Write).unwrap();
            let mut got = Vec::new();
            stream.read_to_end(&mut got).unwrap();
            got_tx.send(got).unwrap();
        })
    };
    let relay = relay(&path, 4);
    let mut stream = client(&relay);
    let mut received = Vec::new();
    stream.read_to_end(&mut received).unwrap();
    assert!(received == greeting, "the greeting differs");
    // The client's direction is still open after the server's end.
    stream.write_all(&request).unwrap();
    stream.shutdown(Shutdown::Write).unwrap();
    let got = got_rx.recv_timeout(T).unwrap();
    assert!(got == request, "the request differs");
    server.join().unwrap();
    relay.stop();
}

#[test]
fn a_client_that_shuts_down_writing_still_gets_the_reply() {
    let (_dir, path) = socket_path();
    // Answers only at the end of the request: the shutdown must pass.
    let server = serve(&path, 1, |mut stream| {
        let mut request = Vec::new();
        stream.read_to_end(&mut request).unwrap();
        let reply = format!("got {} bytes: {}\n", request.len(), request.escape_ascii());
        stream.write_all(reply.as_bytes()).unwrap();
    });
    let relay = relay(&path, 4);
    let mut stream = client(&relay);
    stream.write_all(b"request body").unwrap();
    stream.shutdown(Shutdown::Write).unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    assert_eq!(reply, "got 12 bytes: request body\n");
    server.join().unwrap();
    relay.stop();
}

#[test]
fn a_connection_over_the_cap_waits_until_one_closes() {
    let (_dir, path) = socket_path();
    let accepted = Arc::new(AtomicUsize::new(0));
    let server = {
        let accepted = accepted.clone();
        serve(&path, 3, move |stream| {
            accepted.fetch_add(1, Ordering::SeqCst);
            line_echo(stream);
        })
    };
    let relay = relay(&path, 2);
    let mut first = client(&relay);
    let mut second = client(&relay);
    assert_eq!(round_trip(&mut first, "one\n"), "echo: one\n");
    assert_eq!(round_trip(&mut second, "two\n"), "echo: two\n");
    // The third connects (the backlog) but is not served.
    let mut third = client(&relay);
    third.write_all(b"three\n").unwrap();
    third
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut answer = [0; 64];
    let early = third.read(&mut answer);
    assert!(
        early
            .as_ref()
            .is_err_and(|e| matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)),
        "the third connection was answered at the cap: {early:?}"
    );
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    // One of the two ends: the third is served.
    drop(first);
    third.set_read_timeout(Some(T)).unwrap();
    let mut answer = vec![0; "echo: three\n".len()];
    third.read_exact(&mut answer).unwrap();
    assert_eq!(answer, b"echo: three\n");
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
    assert_eq!(round_trip(&mut second, "still\n"), "echo: still\n");
    drop((second, third));
    server.join().unwrap();
    relay.stop();
}

#[test]
fn a_refused_connect_closes_the_connection_and_the_relay_goes_on() {
    let (_dir, path) = socket_path();
    let relay = relay(&path, 2);
    // No socket at all.
    let mut stream = client(&relay);
    assert_closed(&mut stream);
    // A socket file nobody listens on.
    drop(UnixListener::bind(&path).unwrap());
    let mut stream = client(&relay);
    stream.write_all(b"lost\n").unwrap();
    assert_closed(&mut stream);
    // Once the proxy listens, the next connection is served.
    std::fs::remove_file(&path).unwrap();
    let server = serve(&path, 1, line_echo);
    let mut stream = client(&relay);
    assert_eq!(round_trip(&mut stream, "now\n"), "echo: now\n");
    drop(stream);
    server.join().unwrap();
    relay.stop();
}

#[test]
fn half_done_connections_do_not_wake_the_relay() {
    let (_dir, path) = socket_path();
    let (eof_tx, eof_rx) = mpsc::channel();
    let (reply_tx, reply_rx) = mpsc::channel::<()>();
    let reply_rx = std::sync::Mutex::new(reply_rx);
    let connections = AtomicUsize::new(0);
    let server = serve(&path, 2, move |mut stream| {
        if connections.fetch_add(1, Ordering::SeqCst) == 0 {
            // The first: the client's end arrives, the answer waits.
            let mut request = Vec::new();
            stream.read_to_end(&mut request).unwrap();
            eof_tx.send(()).unwrap();
            reply_rx.lock().unwrap().recv().unwrap();
            stream.write_all(b"late answer").unwrap();
        } else {
            // The second: the server is gone, the client stays.
            stream.write_all(b"bye").unwrap();
        }
    });
    let relay = relay(&path, 4);
    let mut waiting = client(&relay);
    waiting.write_all(b"question").unwrap();
    waiting.shutdown(Shutdown::Write).unwrap();
    eof_rx.recv_timeout(T).unwrap();
    let mut left = client(&relay);
    let mut bye = Vec::new();
    left.read_to_end(&mut bye).unwrap();
    assert_eq!(bye, b"bye");
    // Both are half done: nothing is to be done until something moves.
    std::thread::sleep(Duration::from_millis(100));
    let before = relay.wakeups();
    std::thread::sleep(Duration::from_millis(500));
    let woken = relay.wakeups() - before;
    assert!(woken <= 2, "the relay woke {woken} times while idle");
    reply_tx.send(()).unwrap();
    let mut answer = Vec::new();
    waiting.read_to_end(&mut answer).unwrap();
    assert_eq!(answer, b"late answer");
    drop(left);
    server.join().unwrap();
    relay.stop();
}

#[test]
fn stopping_the_relay_closes_its_connections_and_its_port() {
    let (_dir, path) = socket_path();
    let server = serve(&path, 1, line_echo);
    let relay = relay(&path, 4);
    let port = relay.port();
    let mut stream = client(&relay);
    assert_eq!(round_trip(&mut stream, "hi\n"), "echo: hi\n");
    relay.stop();
    assert_closed(&mut stream);
    // The proxy's side was closed too: its handler saw the end.
    server.join().unwrap();
    let refused = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::ConnectionRefused);
}

#[test]
fn a_port_in_use_is_an_error_naming_it() {
    let taken = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let port = taken.local_addr().unwrap().port();
    let error = Relay::start(&EgressRelay {
        listen_port: port,
        socket: "/nonexistent/proxy.sock".into(),
        max_concurrent: 1,
    })
    .err()
    .expect("the bind fails");
    let message = error.to_string();
    assert!(
        message.contains(&format!("egress relay on 127.0.0.1:{port}")),
        "{message}"
    );
}

#[test]
fn socket_paths_that_cannot_be_connected_to_are_refused_before_the_connect() {
    let long = PathBuf::from(format!("/{}", "x".repeat(MAX_SOCKET_PATH)));
    let error = connect_nonblocking(&long).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidInput);
    let longest = PathBuf::from(format!("/{}", "x".repeat(MAX_SOCKET_PATH - 1)));
    // Long enough but absent: the connect itself fails.
    let error = connect_nonblocking(&longest).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::NotFound);
}
