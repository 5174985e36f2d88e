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
//!
//! # Layout
//!
//! This file holds the [`Relay`] handle and the relay thread's poll loop
//! (`Worker`): what is polled, accepting up to the cap, connecting what it
//! accepted. [`connection`] holds one relayed connection: its two
//! directions and their buffers, moving bytes without blocking, and the
//! non-blocking connect to the socket.

use std::io::{self, ErrorKind};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use code_runner_protocol::EgressRelay;
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::InitError;

mod connection;

use connection::{Connection, connect_nonblocking};

/// Bytes buffered per direction of one connection.
pub(crate) const BUFFER_BYTES: usize = 64 * 1024;

/// The longest socket path a connect can take: `sun_path` of
/// `sockaddr_un` (108 bytes on Linux) less its terminating NUL.
pub(crate) const MAX_SOCKET_PATH: usize = 107;

/// How long the relay stops accepting after `accept` itself failed (out
/// of descriptors, say): the listener stays readable, and polling it
/// again at once would spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(500);

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

#[cfg(test)]
mod tests;
