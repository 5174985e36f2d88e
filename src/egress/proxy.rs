//! The proxy itself: accept, read the head, check, connect, relay.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::addresses::check_address;
use super::allowlist::normalize_host;
use super::http::{self, HeadError, MAX_HEAD, Request};
use super::{EgressEvent, EgressPolicy, reason};

/// The longest the request head may take, whatever `idle_timeout` is.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest writing a refusal may take.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
/// After a refusal, how much of the client's further input is read (and
/// for how long) before closing.
const DRAIN_LIMIT: usize = 64 * 1024;
const DRAIN_TIMEOUT: Duration = Duration::from_secs(1);
/// The relay buffer, per direction.
const BUF: usize = 16 * 1024;

/// A job's running counts, shared by its connections.
#[derive(Debug, Default)]
pub struct JobEgress {
    /// Bytes relayed both ways: what `max_bytes` caps.
    bytes: AtomicU64,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
    connections: AtomicU64,
    refused: AtomicU64,
}

/// A snapshot of a [`JobEgress`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressTotals {
    /// Bytes relayed job → upstream.
    pub bytes_up: u64,
    /// Bytes relayed upstream → job.
    pub bytes_down: u64,
    /// Connections the job opened.
    pub connections: u64,
    /// Of which refused (not relayed).
    pub refused: u64,
}

impl JobEgress {
    /// The counts so far.
    pub fn totals(&self) -> EgressTotals {
        EgressTotals {
            bytes_up: self.bytes_up.load(Ordering::SeqCst),
            bytes_down: self.bytes_down.load(Ordering::SeqCst),
            connections: self.connections.load(Ordering::SeqCst),
            refused: self.refused.load(Ordering::SeqCst),
        }
    }

    /// Takes up to `n` bytes of the allowance `max`; what it got.
    fn claim(&self, n: u64, max: u64) -> u64 {
        let mut current = self.bytes.load(Ordering::SeqCst);
        loop {
            let grant = n.min(max.saturating_sub(current));
            if grant == 0 {
                return 0;
            }
            match self.bytes.compare_exchange_weak(
                current,
                current + grant,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return grant,
                Err(actual) => current = actual,
            }
        }
    }

    fn spent(&self, max: u64) -> bool {
        self.bytes.load(Ordering::SeqCst) >= max
    }
}

/// A running proxy: stop it with [`EgressHandle::stop`]; dropping it stops
/// it too (without waiting).
#[derive(Debug)]
pub struct EgressHandle {
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
    job: Arc<JobEgress>,
}

impl EgressHandle {
    /// Spawns [`serve_counted`] on `listener` (on the current runtime); the
    /// events arrive on the receiver, one per connection.
    pub fn start(
        listener: UnixListener,
        policy: Arc<EgressPolicy>,
    ) -> (EgressHandle, UnboundedReceiver<EgressEvent>) {
        Self::start_with_token(listener, policy, CancellationToken::new())
    }

    /// As [`EgressHandle::start`], also stopping when `stop` is cancelled
    /// (pass a child of the job's token).
    pub fn start_with_token(
        listener: UnixListener,
        policy: Arc<EgressPolicy>,
        stop: CancellationToken,
    ) -> (EgressHandle, UnboundedReceiver<EgressEvent>) {
        let (tx, rx) = unbounded_channel();
        let job = Arc::new(JobEgress::default());
        let task = tokio::spawn(serve_counted(
            listener,
            policy,
            job.clone(),
            tx,
            stop.clone(),
        ));
        let handle = EgressHandle {
            stop,
            task: Some(task),
            job,
        };
        (handle, rx)
    }

    /// The counts so far.
    pub fn totals(&self) -> EgressTotals {
        self.job.totals()
    }

    /// Stops accepting, ends every open connection, waits for them (each
    /// has sent its event by then), and returns the final counts.
    pub async fn stop(mut self) -> EgressTotals {
        self.stop.cancel();
        if let Some(task) = self.task.take()
            && let Err(error) = task.await
        {
            tracing::warn!(%error, "egress: the proxy task failed");
        }
        self.job.totals()
    }
}

impl Drop for EgressHandle {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Serves the job's proxy on `listener` until `stop`, then ends the open
/// connections and returns once they are done. One [`EgressEvent`] per
/// connection goes to `events` (a closed receiver is ignored). The socket
/// file is the caller's to remove.
pub async fn serve(
    listener: UnixListener,
    policy: Arc<EgressPolicy>,
    events: UnboundedSender<EgressEvent>,
    stop: CancellationToken,
) {
    serve_counted(listener, policy, Arc::default(), events, stop).await;
}

/// [`serve`], counting into `job` (which the caller may read meanwhile).
pub async fn serve_counted(
    listener: UnixListener,
    policy: Arc<EgressPolicy>,
    job: Arc<JobEgress>,
    events: UnboundedSender<EgressEvent>,
    stop: CancellationToken,
) {
    let tracker = TaskTracker::new();
    let permits = Arc::new(Semaphore::new(policy.max_concurrent.max(1) as usize));
    loop {
        let permit = tokio::select! {
            () = stop.cancelled() => break,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let accepted = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let client = match accepted {
            Ok((client, _)) => client,
            Err(error) => {
                // EMFILE and the like: do not spin.
                tracing::warn!(%error, "egress: accept failed");
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep(Duration::from_millis(100)) => continue,
                }
            }
        };
        let ordinal = job.connections.fetch_add(1, Ordering::SeqCst) + 1;
        let (policy, job, events, stop) =
            (policy.clone(), job.clone(), events.clone(), stop.clone());
        tracker.spawn(async move {
            let event = handle(client, &policy, &job, ordinal, &stop).await;
            drop(permit);
            if !event.allowed {
                job.refused.fetch_add(1, Ordering::SeqCst);
            }
            tracing::debug!(
                host = %event.host,
                port = event.port,
                address = ?event.address,
                allowed = event.allowed,
                reason = ?event.reason,
                bytes_up = event.bytes_up,
                bytes_down = event.bytes_down,
                "egress connection"
            );
            let _ = events.send(event);
        });
    }
    tracker.close();
    tracker.wait().await;
}

/// A refusal: status line, body, and the event's reason.
struct Refusal {
    status: &'static str,
    body: String,
    reason: &'static str,
}

impl Refusal {
    fn new(status: &'static str, reason: &'static str, body: impl Into<String>) -> Refusal {
        Refusal {
            status,
            body: body.into(),
            reason,
        }
    }
}

/// One connection, start to end.
async fn handle(
    mut client: UnixStream,
    policy: &EgressPolicy,
    job: &JobEgress,
    ordinal: u64,
    stop: &CancellationToken,
) -> EgressEvent {
    let mut event = EgressEvent {
        host: String::new(),
        port: 0,
        address: None,
        allowed: false,
        reason: None,
        bytes_up: 0,
        bytes_down: 0,
    };
    let head_timeout = HEAD_TIMEOUT.min(policy.idle_timeout);
    let (head, rest) = match read_head(&mut client, head_timeout, stop).await {
        Ok(read) => read,
        Err(refusal) => {
            event.reason = Some(refusal.reason.to_owned());
            if refusal.reason != reason::STOPPED {
                respond(&mut client, &refusal).await;
            }
            return event;
        }
    };
    match connect(&head, policy, job, ordinal, stop, &mut event).await {
        Ok((upstream, first)) => {
            event.allowed = true;
            relay(client, upstream, first, rest, policy, job, stop, &mut event).await;
        }
        Err(refusal) => {
            event.reason = Some(refusal.reason.to_owned());
            if refusal.reason != reason::STOPPED {
                respond(&mut client, &refusal).await;
            }
        }
    }
    event
}

/// Reads the request head: the head (through the blank line) and any bytes
/// the client sent after it.
async fn read_head(
    client: &mut UnixStream,
    timeout: Duration,
    stop: &CancellationToken,
) -> Result<(Vec<u8>, Vec<u8>), Refusal> {
    let deadline = Instant::now() + timeout;
    let mut buf: Vec<u8> = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        if buf.len() >= MAX_HEAD {
            return Err(Refusal::new(
                "431 Request Header Fields Too Large",
                reason::HEAD_TOO_LARGE,
                format!("egress: the request head exceeds {MAX_HEAD} bytes"),
            ));
        }
        let room = chunk.len().min(MAX_HEAD - buf.len());
        let read = tokio::select! {
            () = stop.cancelled() => {
                return Err(Refusal::new("503 Service Unavailable", reason::STOPPED, ""));
            }
            () = tokio::time::sleep_until(deadline) => {
                return Err(Refusal::new(
                    "408 Request Timeout",
                    reason::HEAD_TIMEOUT,
                    "egress: the request head did not arrive in time",
                ));
            }
            read = client.read(&mut chunk[..room]) => read,
        };
        match read {
            Ok(0) | Err(_) => {
                return Err(Refusal::new(
                    "400 Bad Request",
                    reason::BAD_REQUEST,
                    "egress: bad request: the connection ended before the request head",
                ));
            }
            Ok(n) => {
                let from = buf.len().saturating_sub(3);
                buf.extend_from_slice(&chunk[..n]);
                if let Some(len) = http::head_len(&buf[from..]) {
                    let rest = buf.split_off(from + len);
                    return Ok((buf, rest));
                }
            }
        }
    }
}

/// Parses and checks the request and connects: the upstream and, for
/// plain HTTP, the rewritten head to send it first (`None`: CONNECT). Fills the event's host, port
/// and address as they become known.
async fn connect(
    head: &[u8],
    policy: &EgressPolicy,
    job: &JobEgress,
    ordinal: u64,
    stop: &CancellationToken,
    event: &mut EgressEvent,
) -> Result<(TcpStream, Option<Vec<u8>>), Refusal> {
    let request = http::parse(head).map_err(|error| match error {
        HeadError::Bad(why) => Refusal::new(
            "400 Bad Request",
            reason::BAD_REQUEST,
            format!("egress: bad request: {why}"),
        ),
        HeadError::NotAProxyRequest => Refusal::new(
            "405 Method Not Allowed",
            reason::BAD_REQUEST,
            "egress: this is a proxy: send CONNECT host:port or GET http://host/path",
        ),
    })?;
    let (host, port, first) = match request {
        Request::Connect { host, port } => (host, port, None),
        Request::Http { host, port, head } => (host, port, Some(head)),
    };
    event.host.clone_from(&host);
    event.port = port;

    if ordinal > u64::from(policy.max_connections) {
        return Err(Refusal::new(
            "429 Too Many Requests",
            reason::CONNECTION_CAP,
            format!(
                "egress: the job may open {} connections; no more",
                policy.max_connections
            ),
        ));
    }
    if job.spent(policy.max_bytes) {
        return Err(Refusal::new(
            "429 Too Many Requests",
            reason::BYTE_CAP,
            format!(
                "egress: the job's {} bytes of egress are spent",
                policy.max_bytes
            ),
        ));
    }
    let name = match normalize_host(&host) {
        Some(name) if policy.allow.allows(&name, port) => name,
        _ => {
            let body = if policy.allow.lists_host(&host) {
                format!("egress: port {port} of {host} is not in the job's allowlist")
            } else {
                format!("egress: {host} is not in the job's allowlist")
            };
            return Err(Refusal::new("403 Forbidden", reason::NOT_ALLOWED, body));
        }
    };

    // Resolve once; every address must pass; connect to the first, pinned.
    let dns_failed = |why: String| {
        Refusal::new(
            "502 Bad Gateway",
            reason::DNS_FAILED,
            format!("egress: {why}"),
        )
    };
    let resolved = tokio::select! {
        () = stop.cancelled() => return Err(Refusal::new("503 Service Unavailable", reason::STOPPED, "")),
        resolved = tokio::time::timeout(policy.connect_timeout, policy.resolver.resolve(&name, port)) => resolved,
    };
    let addresses = match resolved {
        Err(_) => return Err(dns_failed(format!("resolving {host} timed out"))),
        Ok(Err(error)) => return Err(dns_failed(format!("{host} could not be resolved: {error}"))),
        Ok(Ok(addresses)) => addresses,
    };
    let Some(&first_address) = addresses.first() else {
        return Err(dns_failed(format!("{host} resolves to no address")));
    };
    for &ip in &addresses {
        if let Err(why) = check_address(ip, &policy.own, policy.allow_loopback_for_tests) {
            event.address = Some(ip);
            return Err(Refusal::new(
                "403 Forbidden",
                reason::FORBIDDEN_ADDRESS,
                format!("egress: {host} resolves to {ip} ({why}); refused"),
            ));
        }
    }
    event.address = Some(first_address);
    let target = SocketAddr::new(first_address, port);
    let connected = tokio::select! {
        () = stop.cancelled() => return Err(Refusal::new("503 Service Unavailable", reason::STOPPED, "")),
        connected = tokio::time::timeout(policy.connect_timeout, TcpStream::connect(target)) => connected,
    };
    let upstream = match connected {
        Err(_) => {
            return Err(Refusal::new(
                "504 Gateway Timeout",
                reason::CONNECT_TIMEOUT,
                format!(
                    "egress: connecting to {host} ({}) timed out",
                    show(first_address, port)
                ),
            ));
        }
        Ok(Err(error)) => {
            return Err(Refusal::new(
                "502 Bad Gateway",
                reason::CONNECT_FAILED,
                format!(
                    "egress: could not connect to {host} ({}): {error}",
                    show(first_address, port)
                ),
            ));
        }
        Ok(Ok(upstream)) => upstream,
    };
    let _ = upstream.set_nodelay(true);
    Ok((upstream, first))
}

fn show(ip: IpAddr, port: u16) -> String {
    SocketAddr::new(ip, port).to_string()
}

/// Writes a refusal and closes the write side.
async fn respond(client: &mut UnixStream, refusal: &Refusal) {
    let body = format!("{}\n", refusal.body);
    let response = format!(
        "HTTP/1.1 {}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        refusal.status,
        body.len()
    );
    let write = async {
        client.write_all(response.as_bytes()).await?;
        client.shutdown().await
    };
    if tokio::time::timeout(RESPONSE_TIMEOUT, write).await.is_err() {
        return;
    }
    // Closing with unread input would reset the connection (and could
    // lose the answer): read a little of what the client still sends.
    let drain = async {
        let mut sink = [0u8; 4096];
        let mut left = DRAIN_LIMIT;
        while left > 0 {
            match client.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, drain).await;
}

/// How a direction of the relay ended.
enum PumpEnd {
    Eof,
    Cap,
    Error,
}

/// When the relay last moved a byte, in milliseconds since it began.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.fetch_max(ms, Ordering::SeqCst);
    }

    /// Returns once nothing has moved for `idle`.
    async fn idle(&self, idle: Duration) {
        loop {
            let last = self.start + Duration::from_millis(self.last_ms.load(Ordering::SeqCst));
            let deadline = last + idle;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// One direction's counters: the connection's and the job's.
struct Counters<'a> {
    connection: &'a AtomicU64,
    job_direction: &'a AtomicU64,
    job: &'a JobEgress,
    max: u64,
    activity: &'a Activity,
}

impl Counters<'_> {
    /// Forwards what the allowance permits of `data`; `Cap` when not all.
    async fn forward<W: AsyncWrite + Unpin>(&self, w: &mut W, data: &[u8]) -> Result<(), PumpEnd> {
        if data.is_empty() {
            return Ok(());
        }
        let grant = self.job.claim(data.len() as u64, self.max);
        let granted = &data[..usize::try_from(grant).unwrap_or(data.len())];
        if !granted.is_empty() {
            w.write_all(granted).await.map_err(|_| PumpEnd::Error)?;
            self.connection.fetch_add(grant, Ordering::SeqCst);
            self.job_direction.fetch_add(grant, Ordering::SeqCst);
            self.activity.touch();
        }
        if granted.len() < data.len() {
            return Err(PumpEnd::Cap);
        }
        Ok(())
    }

    /// Copies `r` to `w` until EOF (then shuts `w` down), the cap, or an
    /// error.
    async fn pump<R, W>(&self, r: &mut R, w: &mut W) -> PumpEnd
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let mut buf = vec![0u8; BUF];
        loop {
            let n = match r.read(&mut buf).await {
                Ok(0) => {
                    let _ = w.shutdown().await;
                    return PumpEnd::Eof;
                }
                Ok(n) => n,
                Err(_) => return PumpEnd::Error,
            };
            self.activity.touch();
            if let Err(end) = self.forward(w, &buf[..n]).await {
                return end;
            }
        }
    }
}

/// Relays until both sides have closed, the idle timeout, the byte cap, an
/// error, or `stop`; records the bytes and the end in the event.
#[allow(clippy::too_many_arguments)]
async fn relay(
    mut client: UnixStream,
    mut upstream: TcpStream,
    first: Option<Vec<u8>>,
    rest: Vec<u8>,
    policy: &EgressPolicy,
    job: &JobEgress,
    stop: &CancellationToken,
    event: &mut EgressEvent,
) {
    let up_bytes = AtomicU64::new(0);
    let down_bytes = AtomicU64::new(0);
    let activity = Activity {
        start: Instant::now(),
        last_ms: AtomicU64::new(0),
    };
    let up = Counters {
        connection: &up_bytes,
        job_direction: &job.bytes_up,
        job,
        max: policy.max_bytes,
        activity: &activity,
    };
    let down = Counters {
        connection: &down_bytes,
        job_direction: &job.bytes_down,
        job,
        max: policy.max_bytes,
        activity: &activity,
    };
    let end = async {
        let (mut client_r, mut client_w) = client.split();
        let (mut upstream_r, mut upstream_w) = upstream.split();
        let first = match first {
            Some(head) => head,
            None => {
                // CONNECT: the tunnel is up.
                let established = b"HTTP/1.1 200 Connection established\r\n\r\n";
                if client_w.write_all(established).await.is_err() {
                    return Some(reason::IO_ERROR);
                }
                Vec::new()
            }
        };
        for data in [&first, &rest] {
            match up.forward(&mut upstream_w, data).await {
                Ok(()) => {}
                Err(PumpEnd::Cap) => return Some(reason::BYTE_CAP),
                Err(_) => return Some(reason::IO_ERROR),
            }
        }
        let pump_up = up.pump(&mut client_r, &mut upstream_w);
        let pump_down = down.pump(&mut upstream_r, &mut client_w);
        let idle = activity.idle(policy.idle_timeout);
        tokio::pin!(pump_up, pump_down, idle);
        let (mut up_done, mut down_done) = (false, false);
        loop {
            let end = tokio::select! {
                () = stop.cancelled() => return Some(reason::STOPPED),
                () = &mut idle => return Some(reason::IDLE_TIMEOUT),
                end = &mut pump_up, if !up_done => {
                    up_done = true;
                    end
                }
                end = &mut pump_down, if !down_done => {
                    down_done = true;
                    end
                }
            };
            match end {
                PumpEnd::Eof if up_done && down_done => return None,
                PumpEnd::Eof => {}
                PumpEnd::Cap => return Some(reason::BYTE_CAP),
                PumpEnd::Error => return Some(reason::IO_ERROR),
            }
        }
    }
    .await;
    event.reason = end.map(str::to_owned);
    event.bytes_up = up_bytes.load(Ordering::SeqCst);
    event.bytes_down = down_bytes.load(Ordering::SeqCst);
}
