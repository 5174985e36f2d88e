//! The sandbox's half of a job's egress: a relay from a loopback TCP port
//! to the job's egress proxy, which listens on a Unix socket outside.
//!
//! The sandbox has no network, only loopback. A job that may reach some
//! hosts gets a Unix socket bind-mounted into its sandbox, on which the
//! worker's proxy listens; the programs only speak to TCP proxies
//! (`HTTP_PROXY=http://127.0.0.1:<port>`). So the supervisor listens on
//! `127.0.0.1:<listen_port>` and, for every connection it accepts, opens a
//! new connection to the socket and copies the bytes both ways until both
//! directions are done: when one side reaches its end of stream, its last
//! bytes are written and then the other side's writing half is shut down
//! (`shutdown(SHUT_WR)`), so a client that half-closes still gets its
//! answer. An error on either side closes both.
//!
//! # One thread, `poll`
//!
//! Every thread counts against the sandbox's pids limit, which the job's
//! own processes share, so the relay is one thread whatever the number of
//! connections: it waits in `poll(2)` (without a timeout) on the listener,
//! on the sockets of every connection that can make progress and on the
//! receiving end of a socket pair whose other end the [`Relay`] handle
//! holds, and does non-blocking I/O only, the connect to the Unix socket
//! included. A socket is polled only for what its connection waits for
//! (readable while its direction has no bytes pending, writable while the
//! other direction has some); a socket with nothing to wait for is left out
//! of the set, as a hung-up socket would otherwise wake the thread at once,
//! again and again. Each direction buffers at most [`BUFFER_BYTES`].
//!
//! # The cap
//!
//! At most `max_concurrent` connections are relayed at once. At the cap the
//! listener is left out of the poll set: further connections wait in the
//! kernel's listen backlog (their connect has succeeded, nothing is read
//! from them) until one of the relayed ones ends.
//!
//! # What it does not do
//!
//! It looks at none of the bytes: no parsing, no filtering, no logging of
//! what passes. The worker's proxy, at the other end of the socket, is the
//! policy and decides what may pass. A connection the relay cannot connect
//! to the socket (no proxy, a full backlog: the connect does not wait) is
//! closed at once; the relay goes on serving the next one. Nothing the
//! relay meets makes the supervisor fail: it only reports, once, on stderr.
//!
//! The relay runs as the supervisor (root in the container, no capability
//! needed: the port is unprivileged and the socket world-writable), and
//! lives until the [`Relay`] is dropped: at the end of the supervisor's
//! work. Writes to a socket whose peer is gone fail with `EPIPE` rather
//! than raise `SIGPIPE`, which the Rust runtime ignores in this process.

use std::io::{self, ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use code_runner_protocol::EgressRelay;
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::InitError;

/// Bytes buffered per direction of one connection.
pub(crate) const BUFFER_BYTES: usize = 64 * 1024;

/// The longest socket path a connect can take: `sun_path` of
/// `sockaddr_un` (108 bytes on Linux) less its terminating NUL.
pub(crate) const MAX_SOCKET_PATH: usize = 107;

/// How long the relay stops accepting after `accept` itself failed (out
/// of descriptors, say): the listener stays readable, and polling it
/// again at once would spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(500);

/// Reads per direction of a connection at each wakeup, so that one busy
/// connection does not starve the others (`poll` comes back at once for
/// what is left).
const READS_PER_WAKEUP: usize = 4;

/// The running relay; dropping it stops the relay, which then closes the
/// listener and every connection (the thread is not waited for).
pub(crate) struct Relay {
    /// The thread ends when this, its only other end, is closed.
    _stop: UnixStream,
    #[cfg(test)]
    probe: Probe,
}

/// What the unit tests look at.
#[cfg(test)]
struct Probe {
    port: u16,
    thread: std::thread::JoinHandle<()>,
    /// How many times `poll` returned.
    wakeups: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Relay {
    /// Listens on `127.0.0.1:listen_port` and starts the relay thread.
    pub(crate) fn start(config: &EgressRelay) -> Result<Self, InitError> {
        let listener = listen(config.listen_port).map_err(|source| InitError::EgressListen {
            port: config.listen_port,
            source,
        })?;
        let max_concurrent = usize::try_from(config.max_concurrent).unwrap_or(usize::MAX);
        Self::spawn(listener, PathBuf::from(&config.socket), max_concurrent).map_err(|source| {
            InitError::Thread {
                thread: "egress relay",
                source,
            }
        })
    }

    /// Starts the relay thread on a listener that [`listen`] made.
    fn spawn(listener: TcpListener, socket: PathBuf, max_concurrent: usize) -> io::Result<Self> {
        let (stop, stopped) = UnixStream::pair()?;
        #[cfg(test)]
        let port = listener.local_addr()?.port();
        #[cfg(test)]
        let wakeups = std::sync::Arc::<std::sync::atomic::AtomicU64>::default();
        let worker = Worker {
            listener,
            socket,
            max_concurrent: max_concurrent.max(1),
            stopped,
            connections: Vec::new(),
            accept_paused_until: None,
            warned_connect: false,
            warned_accept: false,
            #[cfg(test)]
            wakeups: wakeups.clone(),
        };
        let _thread = super::spawn_named("egress-relay", move || worker.run())?;
        Ok(Self {
            _stop: stop,
            #[cfg(test)]
            probe: Probe {
                port,
                thread: _thread,
                wakeups,
            },
        })
    }
}

/// A non-blocking listener on `127.0.0.1:port` (0: any free port).
fn listen(port: u16) -> io::Result<TcpListener> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// The relay thread's state.
struct Worker {
    listener: TcpListener,
    socket: PathBuf,
    max_concurrent: usize,
    /// Readable (end of stream) once the [`Relay`] is dropped.
    stopped: UnixStream,
    connections: Vec<Connection>,
    /// Set after `accept` failed: the listener is not polled until then.
    accept_paused_until: Option<Instant>,
    warned_connect: bool,
    warned_accept: bool,
    #[cfg(test)]
    wakeups: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Worker {
    fn run(mut self) {
        loop {
            let now = Instant::now();
            if self.accept_paused_until.is_some_and(|until| until <= now) {
                self.accept_paused_until = None;
            }
            let accepting =
                self.accept_paused_until.is_none() && self.connections.len() < self.max_concurrent;
            let timeout = match self.accept_paused_until {
                // Rounded up, so as not to wake just before the pause ends.
                Some(until) => PollTimeout::try_from((until - now) + Duration::from_millis(1))
                    .unwrap_or(PollTimeout::MAX),
                None => PollTimeout::NONE,
            };
            let Some(woken) = self.wait(accepting, timeout) else {
                continue;
            };
            #[cfg(test)]
            self.wakeups
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if woken.stop {
                return;
            }
            let mut index = 0;
            self.connections.retain_mut(|connection| {
                let ready = woken.connections[index];
                index += 1;
                !ready || connection.pump().is_ok_and(|()| !connection.finished())
            });
            if woken.listener {
                self.accept();
            }
        }
    }

    /// Polls once; `None` if `poll` was interrupted or failed (a failure
    /// is reported and followed by a pause).
    fn wait(&mut self, accepting: bool, timeout: PollTimeout) -> Option<Woken> {
        let mut fds = Vec::with_capacity(2 + 2 * self.connections.len());
        fds.push(PollFd::new(self.stopped.as_fd(), PollFlags::POLLIN));
        if accepting {
            fds.push(PollFd::new(self.listener.as_fd(), PollFlags::POLLIN));
        }
        // For each connection, where its sockets are in `fds` (if at all).
        let mut slots = Vec::with_capacity(self.connections.len());
        for connection in &self.connections {
            let (tcp, unix) = connection.interest();
            let mut slot = [None, None];
            for (slot, (fd, events)) in slot.iter_mut().zip([
                (connection.tcp.as_fd(), tcp),
                (connection.unix.as_fd(), unix),
            ]) {
                if !events.is_empty() {
                    *slot = Some(fds.len());
                    fds.push(PollFd::new(fd, events));
                }
            }
            slots.push(slot);
        }
        match poll(&mut fds, timeout) {
            Ok(_) => {}
            Err(Errno::EINTR) => return None,
            Err(errno) => {
                eprintln!("code-runner-init: egress relay: poll failed: {errno}");
                std::thread::sleep(ACCEPT_BACKOFF);
                return None;
            }
        }
        // Flags nix does not know of count as an event too.
        let ready = |index: usize| {
            fds[index]
                .revents()
                .is_none_or(|revents| !revents.is_empty())
        };
        Some(Woken {
            stop: ready(0),
            listener: accepting && ready(1),
            connections: slots
                .iter()
                .map(|slot| slot.iter().flatten().any(|&index| ready(index)))
                .collect(),
        })
    }

    /// Accepts what is waiting, up to the cap.
    fn accept(&mut self) {
        while self.connections.len() < self.max_concurrent {
            match self.listener.accept() {
                Ok((tcp, _)) => self.admit(tcp),
                Err(error) if error.kind() == ErrorKind::WouldBlock => return,
                Err(error)
                    if matches!(
                        error.kind(),
                        ErrorKind::Interrupted | ErrorKind::ConnectionAborted
                    ) => {}
                Err(error) => {
                    if !std::mem::replace(&mut self.warned_accept, true) {
                        eprintln!(
                            "code-runner-init: egress relay: accept failed: {error}; pausing (not reported again)"
                        );
                    }
                    self.accept_paused_until = Some(Instant::now() + ACCEPT_BACKOFF);
                    return;
                }
            }
        }
    }

    /// Connects an accepted connection to the socket, or closes it.
    fn admit(&mut self, tcp: TcpStream) {
        if tcp.set_nonblocking(true).is_err() {
            return;
        }
        // Bytes are passed on as they come; nothing is gained by holding
        // them back.
        let _ = tcp.set_nodelay(true);
        match connect_nonblocking(&self.socket) {
            Ok(unix) => self.connections.push(Connection::new(tcp, unix)),
            Err(error) => {
                if !std::mem::replace(&mut self.warned_connect, true) {
                    eprintln!(
                        "code-runner-init: egress relay: cannot connect to {}: {error}; closing the connection (not reported again)",
                        self.socket.display()
                    );
                }
            }
        }
    }
}

/// What one `poll` found.
struct Woken {
    stop: bool,
    listener: bool,
    /// Per connection, in order: whether either of its sockets had an event.
    connections: Vec<bool>,
}

/// One relayed connection: the accepted TCP connection and the one to the
/// socket made for it.
struct Connection {
    tcp: TcpStream,
    unix: UnixStream,
    /// From the TCP client to the socket.
    up: Direction,
    /// From the socket to the TCP client.
    down: Direction,
}

impl Connection {
    fn new(tcp: TcpStream, unix: UnixStream) -> Self {
        Self {
            tcp,
            unix,
            up: Direction::new(),
            down: Direction::new(),
        }
    }

    /// What to poll the TCP socket and the Unix socket for. After every
    /// [`Self::pump`] each direction either has bytes pending (its
    /// destination is polled for writing), or waits for its source (polled
    /// for reading), or is done; so a connection that is not finished
    /// always has something in the poll set.
    fn interest(&self) -> (PollFlags, PollFlags) {
        let mut tcp = PollFlags::empty();
        let mut unix = PollFlags::empty();
        if self.up.wants_read() {
            tcp |= PollFlags::POLLIN;
        }
        if self.up.pending() {
            unix |= PollFlags::POLLOUT;
        }
        if self.down.wants_read() {
            unix |= PollFlags::POLLIN;
        }
        if self.down.pending() {
            tcp |= PollFlags::POLLOUT;
        }
        (tcp, unix)
    }

    /// Moves what can be moved without blocking, both ways; an error means
    /// the connection is over.
    fn pump(&mut self) -> io::Result<()> {
        self.up.pump(&mut self.tcp, &mut self.unix)?;
        self.down.pump(&mut self.unix, &mut self.tcp)
    }

    fn finished(&self) -> bool {
        self.up.done() && self.down.done()
    }
}

/// One direction of a connection: the bytes read from its source and not
/// yet written to its destination, and how far its end has come.
struct Direction {
    buffer: Box<[u8]>,
    /// `buffer[start..end]` is still to be written.
    start: usize,
    end: usize,
    /// The source reached its end of stream.
    eof: bool,
    /// The destination's writing half has been shut down (after `eof`).
    shut: bool,
}

impl Direction {
    fn new() -> Self {
        Self {
            buffer: vec![0; BUFFER_BYTES].into_boxed_slice(),
            start: 0,
            end: 0,
            eof: false,
            shut: false,
        }
    }

    fn pending(&self) -> bool {
        self.start < self.end
    }

    /// The source is read only when everything read before is written.
    fn wants_read(&self) -> bool {
        !self.eof && !self.pending()
    }

    fn done(&self) -> bool {
        self.eof && !self.pending() && self.shut
    }

    /// Writes what is pending, reads more, and so on until either side
    /// would block (or [`READS_PER_WAKEUP`] reads); at the source's end,
    /// once everything is written, shuts the destination's writing half.
    /// Never ends with bytes read but not tried to write, nor with the end
    /// seen but not passed on.
    fn pump(&mut self, source: &mut impl Read, destination: &mut impl Endpoint) -> io::Result<()> {
        let mut reads = READS_PER_WAKEUP;
        loop {
            while self.pending() {
                match destination.write(&self.buffer[self.start..self.end]) {
                    Ok(0) => return Err(ErrorKind::WriteZero.into()),
                    Ok(written) => self.start += written,
                    Err(error) if error.kind() == ErrorKind::WouldBlock => return Ok(()),
                    Err(error) if error.kind() == ErrorKind::Interrupted => {}
                    Err(error) => return Err(error),
                }
            }
            self.start = 0;
            self.end = 0;
            if self.eof {
                if !self.shut {
                    destination.shutdown_write()?;
                    self.shut = true;
                }
                return Ok(());
            }
            if reads == 0 {
                return Ok(());
            }
            reads -= 1;
            match source.read(&mut self.buffer) {
                Ok(0) => self.eof = true,
                Ok(read) => self.end = read,
                Err(error) if error.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(error) if error.kind() == ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
        }
    }
}

/// A socket the relay writes to.
trait Endpoint: Write {
    fn shutdown_write(&self) -> io::Result<()>;
}

impl Endpoint for TcpStream {
    fn shutdown_write(&self) -> io::Result<()> {
        self.shutdown(Shutdown::Write)
    }
}

impl Endpoint for UnixStream {
    fn shutdown_write(&self) -> io::Result<()> {
        self.shutdown(Shutdown::Write)
    }
}

/// Connects a new non-blocking Unix stream socket to `path` without
/// waiting: a listener whose backlog is full fails it (`EAGAIN`) instead
/// of blocking the relay, which `UnixStream::connect` would do.
fn connect_nonblocking(path: &Path) -> io::Result<UnixStream> {
    let bytes = path.as_os_str().as_bytes();
    let mut address = nix::libc::sockaddr_un {
        sun_family: nix::libc::AF_UNIX as nix::libc::sa_family_t,
        sun_path: [0; 108],
    };
    if bytes.len() >= address.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            ErrorKind::InvalidInput,
            "not a usable Unix socket path",
        ));
    }
    for (to, &from) in address.sun_path.iter_mut().zip(bytes) {
        *to = from as nix::libc::c_char;
    }
    let socket = new_socket()?;
    connect(&socket, &address)?;
    Ok(UnixStream::from(socket))
}

/// A new Unix stream socket, non-blocking and close-on-exec (a stage must
/// not inherit it).
#[allow(unsafe_code)]
fn new_socket() -> io::Result<OwnedFd> {
    use nix::libc::{AF_UNIX, SOCK_CLOEXEC, SOCK_NONBLOCK, SOCK_STREAM};
    // SAFETY: socket takes no pointers; its result is checked.
    let fd = unsafe { nix::libc::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `connect(2)`; nix would need its `socket` feature, which brings in a
/// crate the supervisor does not otherwise have, for this one call.
#[allow(unsafe_code)]
fn connect(socket: &OwnedFd, address: &nix::libc::sockaddr_un) -> io::Result<()> {
    let length = std::mem::size_of::<nix::libc::sockaddr_un>() as nix::libc::socklen_t;
    // SAFETY: connect reads `length` bytes at `address`, a live
    // `sockaddr_un` of exactly that size, during the call only.
    let result = unsafe {
        nix::libc::connect(
            socket.as_raw_fd(),
            std::ptr::from_ref(address).cast::<nix::libc::sockaddr>(),
            length,
        )
    };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;
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
}
