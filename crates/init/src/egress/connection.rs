//! One relayed connection of the [egress relay](super): its two
//! directions, each with its buffer and how far its end has come, and how
//! they move bytes without blocking; and the non-blocking connect to the
//! proxy's Unix socket that makes the second half of each connection. The
//! poll loop that drives them is in [`super`].

use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::Path;

use nix::poll::PollFlags;

use super::BUFFER_BYTES;

/// Reads per direction of a connection at each wakeup, so that one busy
/// connection does not starve the others (`poll` comes back at once for
/// what is left).
const READS_PER_WAKEUP: usize = 4;

/// One relayed connection: the accepted TCP connection and the one to the
/// socket made for it.
pub(super) struct Connection {
    pub(super) tcp: TcpStream,
    pub(super) unix: UnixStream,
    /// From the TCP client to the socket.
    up: Direction,
    /// From the socket to the TCP client.
    down: Direction,
}

impl Connection {
    pub(super) fn new(tcp: TcpStream, unix: UnixStream) -> Self {
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
    pub(super) fn interest(&self) -> (PollFlags, PollFlags) {
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
    pub(super) fn pump(&mut self) -> io::Result<()> {
        self.up.pump(&mut self.tcp, &mut self.unix)?;
        self.down.pump(&mut self.unix, &mut self.tcp)
    }

    pub(super) fn finished(&self) -> bool {
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
pub(super) fn connect_nonblocking(path: &Path) -> io::Result<UnixStream> {
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
