//! Two timers of one HTTP/1 connection, which hyper's single
//! `header_read_timeout` cannot tell apart:
//!
//! - **the header timeout**: once the first byte of a request has come,
//!   its headers must be in within `header` (a client that trickles
//!   headers cannot hold a connection);
//! - **the keep-alive**: a connection with no request in flight and no
//!   byte of the next one is closed after `keep_alive`, which is long
//!   (longer than the idle time of common clients' pools), so the client
//!   is the one that closes an idle connection, not the server.
//!
//! A new connection starts as if its first request had begun: it has the
//! header timeout to send it.
//!
//! Why: a server that closes an idle keep-alive connection races a client
//! that sends its next request on it at that moment; the request meets a
//! closed socket and the client sees "connection reset by peer" though it
//! did nothing wrong. The race is at the server's idle timeout, so it is
//! made long; the header timeout stays short.
//!
//! [`Watched`] is the connection's I/O: it notes the first byte of a
//! request while the connection is idle. [`track`] marks a request in
//! flight from the moment the service takes it until its response body is
//! done (a stream's body lasts as long as the stream). [`Watch::expired`]
//! says when either timer ran out: the server loop then closes the
//! connection, gracefully for an idle one.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::Response;
use http_body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

/// Where a connection is between requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// No request in flight and no byte of the next one, since then.
    Idle(Instant),
    /// A request's first byte came; its head must be in by then.
    Head(Instant),
    /// This many requests are in flight (their responses not yet done).
    Busy(usize),
}

/// What ran out on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// Idle for the keep-alive: close it gracefully.
    KeepAlive,
    /// A request's headers did not come in time: drop it.
    Header,
}

/// The first bytes of an HTTP/2 connection (its client preface).
const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0";

/// One connection's phase and its two timers.
#[derive(Debug)]
pub struct Watch {
    phase: Mutex<Phase>,
    /// An HTTP/2 connection: its frames between requests (pings, settings)
    /// are no request's head, so only the keep-alive applies (hyper's own
    /// HTTP/2 keep-alive pings watch a dead peer).
    http2: std::sync::atomic::AtomicBool,
    /// Whether the connection's first bytes were looked at.
    first_read: std::sync::atomic::AtomicBool,
    changed: Notify,
    header: Duration,
    keep_alive: Duration,
}

impl Watch {
    /// A new connection: its first request must begin and have its
    /// headers in within the header timeout.
    pub fn new(header: Duration, keep_alive: Duration) -> Arc<Self> {
        Arc::new(Self {
            phase: Mutex::new(Phase::Head(Instant::now() + header)),
            http2: std::sync::atomic::AtomicBool::new(false),
            first_read: std::sync::atomic::AtomicBool::new(true),
            changed: Notify::new(),
            header,
            keep_alive,
        })
    }

    fn set(&self, change: impl FnOnce(Phase) -> Phase) {
        let mut phase = self.phase.lock().unwrap_or_else(PoisonError::into_inner);
        let next = change(*phase);
        if next != *phase {
            *phase = next;
            self.changed.notify_one();
        }
    }

    /// Bytes came: the first byte of a request when the connection was
    /// idle (HTTP/1). `first` are the connection's first bytes, if these
    /// are: an HTTP/2 preface turns the header timer off for good.
    fn read_some(&self, first: Option<&[u8]>) {
        use std::sync::atomic::Ordering;
        if let Some(bytes) = first
            && bytes.starts_with(&HTTP2_PREFACE[..bytes.len().min(HTTP2_PREFACE.len())])
            && bytes.len() >= 3
        {
            self.http2.store(true, Ordering::Relaxed);
            self.set(|phase| match phase {
                Phase::Head(_) => Phase::Idle(Instant::now()),
                other => other,
            });
            return;
        }
        if self.http2.load(Ordering::Relaxed) {
            return;
        }
        let header = self.header;
        self.set(|phase| match phase {
            Phase::Idle(_) => Phase::Head(Instant::now() + header),
            other => other,
        });
    }

    fn request_started(&self) {
        self.set(|phase| match phase {
            Phase::Busy(n) => Phase::Busy(n + 1),
            _ => Phase::Busy(1),
        });
    }

    fn request_done(&self) {
        self.set(|phase| match phase {
            Phase::Busy(n) if n > 1 => Phase::Busy(n - 1),
            _ => Phase::Idle(Instant::now()),
        });
    }

    /// Resolves when a timer runs out (never while a request is in flight).
    pub async fn expired(&self) -> Expired {
        loop {
            let changed = self.changed.notified();
            let phase = *self.phase.lock().unwrap_or_else(PoisonError::into_inner);
            let (deadline, expired) = match phase {
                Phase::Idle(since) => (Some(since + self.keep_alive), Expired::KeepAlive),
                Phase::Head(deadline) => (Some(deadline), Expired::Header),
                Phase::Busy(_) => (None, Expired::KeepAlive),
            };
            match deadline {
                Some(deadline) => tokio::select! {
                    () = tokio::time::sleep_until(deadline) => return expired,
                    () = changed => {}
                },
                None => changed.await,
            }
        }
    }
}

/// A connection's I/O, noting the first byte of each request.
pub struct Watched<S> {
    inner: S,
    watch: Arc<Watch>,
}

impl<S> Watched<S> {
    pub fn new(inner: S, watch: Arc<Watch>) -> Self {
        Self { inner, watch }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            let first = self
                .watch
                .first_read
                .swap(false, std::sync::atomic::Ordering::Relaxed);
            let read = &buf.filled()[before..];
            self.watch.read_some(first.then_some(read));
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Marks a request in flight until `response`'s body is done (read to its
/// end, or dropped).
pub fn track(flight: InFlight, response: Response) -> Response {
    let (parts, body) = response.into_parts();
    Response::from_parts(
        parts,
        Body::new(Tracked {
            inner: body,
            _guard: flight,
        }),
    )
}

/// Notes the request's start now and its end when dropped.
pub struct InFlight(Arc<Watch>);

impl InFlight {
    pub fn start(watch: &Arc<Watch>) -> Self {
        watch.request_started();
        Self(watch.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.request_done();
    }
}

/// A response body that ends its request's flight when it is dropped.
struct Tracked {
    inner: Body,
    _guard: InFlight,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_http2_connection_has_only_the_keep_alive() {
        let watch = Watch::new(Duration::from_secs(10), Duration::from_secs(120));
        watch.read_some(Some(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"));
        // A ping's answer between requests is no request's head.
        tokio::time::advance(Duration::from_secs(30)).await;
        watch.read_some(None);
        let started = Instant::now();
        assert_eq!(watch.expired().await, Expired::KeepAlive);
        assert_eq!(started.elapsed(), Duration::from_secs(90));
        // An HTTP/1 request's first bytes are not the preface.
        let http1 = Watch::new(Duration::from_secs(10), Duration::from_secs(120));
        http1.read_some(Some(b"GET / HTTP/1.1\r\n"));
        assert_eq!(http1.expired().await, Expired::Header);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_expires_after_the_keep_alive_and_a_slow_head_after_the_header_timeout()
     {
        // A new connection has the header timeout for its first request.
        let watch = Watch::new(Duration::from_secs(10), Duration::from_secs(120));
        let started = Instant::now();
        assert_eq!(watch.expired().await, Expired::Header);
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        // After a request: the keep-alive.
        drop(InFlight::start(&watch));
        let idle = Instant::now();
        assert_eq!(watch.expired().await, Expired::KeepAlive);
        assert_eq!(idle.elapsed(), Duration::from_secs(120));

        // A first byte after a while idle: the head has 10 s from then.
        drop(InFlight::start(&watch));
        tokio::time::advance(Duration::from_secs(50)).await;
        watch.read_some(None);
        let at = Instant::now();
        assert_eq!(watch.expired().await, Expired::Header);
        assert_eq!(at.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_expires_while_a_request_is_in_flight_and_the_keep_alive_restarts_after_it() {
        let watch = Watch::new(Duration::from_secs(10), Duration::from_secs(120));
        watch.read_some(None);
        let flight = InFlight::start(&watch);
        let waiting = tokio::spawn({
            let watch = watch.clone();
            async move { watch.expired().await }
        });
        tokio::time::advance(Duration::from_secs(1000)).await;
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        let ended = Instant::now();
        drop(flight);
        assert_eq!(waiting.await.unwrap(), Expired::KeepAlive);
        assert_eq!(ended.elapsed(), Duration::from_secs(120));
    }
}
