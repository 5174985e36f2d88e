//! The HTTP server loop under the API and the ops endpoints: hyper with
//! two timers per connection ([`super::idle`]) — a short header timeout
//! (a request's headers, once its first byte came, and a new connection's
//! first request: a client that opens connections and sends nothing cannot
//! hold them) and a long keep-alive between requests (so a client's pool
//! closes an idle connection before the server does: a server closing it
//! races the client's next request, which then sees a reset) — and a
//! graceful shutdown that lets requests in flight finish. axum's own
//! `serve` sets no timer; this loop is the same hyper builder with them.
//!
//! Each connection gets TCP_NODELAY (an interactive job's echo is one small
//! frame each way; Nagle's algorithm would hold it back behind the last
//! unacknowledged one) and its peer address as axum's `ConnectInfo` (Piston's
//! keyless mode serves loopback clients only).
//!
//! An accept error that concerns one connection, or the process running
//! out of descriptors or memory for a moment, is logged and the loop goes
//! on (after a pause for the latter); any other (the listening socket
//! itself failed) ends the server with that error, and the process exits
//! non-zero.

use std::net::SocketAddr;
use std::time::Duration;

use std::sync::Arc;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;

use super::idle::{Expired, InFlight, Watch, Watched, track};

/// Header read timeout of the ops endpoints of worker and reaper processes.
pub const OPS_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// An HTTP/2 connection is pinged this often and closed when a ping is
/// not answered within the header timeout.
const HTTP2_KEEP_ALIVE: Duration = Duration::from_secs(30);

/// Whether an accept error concerns one connection only (the loop goes on
/// at once), and how long to pause first when the process ran out of a
/// resource; `None`: the listener itself failed.
fn accept_pause(error: &std::io::Error) -> Option<Duration> {
    use std::io::ErrorKind;
    match error.kind() {
        ErrorKind::ConnectionAborted
        | ErrorKind::ConnectionReset
        | ErrorKind::ConnectionRefused
        | ErrorKind::Interrupted
        | ErrorKind::WouldBlock
        | ErrorKind::TimedOut => Some(Duration::ZERO),
        _ => match error.raw_os_error() {
            // EMFILE, ENFILE, ENOBUFS, ENOMEM: wait for descriptors or
            // memory to come back.
            Some(24 | 23 | 105 | 12) => Some(Duration::from_millis(500)),
            // EPROTO, EPERM (a firewall rule), ENETDOWN and the like: one
            // connection's trouble.
            Some(71 | 1 | 100 | 101 | 64 | 113 | 92 | 95) => Some(Duration::ZERO),
            _ => None,
        },
    }
}

/// A connection's two timers (see [`super::idle`]): how long a request's
/// headers may take once its first byte came (and how long a new
/// connection may stay silent), and how long a connection is kept idle
/// between requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timers {
    pub header: Duration,
    pub keep_alive: Duration,
}

/// The ops endpoints' timers.
pub const OPS_TIMERS: Timers = Timers {
    header: OPS_HEADER_TIMEOUT,
    keep_alive: DEFAULT_KEEP_ALIVE,
};

/// How long an idle keep-alive connection is kept by default: longer than
/// the idle time of common clients' pools (reqwest's and Go's 90 s), so
/// they close it first.
pub const DEFAULT_KEEP_ALIVE: Duration = Duration::from_secs(120);

/// Serves `app` on `listener` until `shutdown`, then waits for the
/// connections in flight to finish their requests. `Err` when the listener
/// failed.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    shutdown: CancellationToken,
    timers: Timers,
) -> std::io::Result<()> {
    let mut builder = Builder::new(TokioExecutor::new());
    // hyper's own timer starts when a connection waits for a head, idle or
    // not: a backstop behind ours, which tell the two apart.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(timers.keep_alive + timers.header);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(HTTP2_KEEP_ALIVE)
        .keep_alive_timeout(timers.header);
    let connections = TaskTracker::new();
    let failed = loop {
        let (stream, peer) = match accept(&listener, &shutdown).await {
            Some(Ok(accepted)) => accepted,
            Some(Err(error)) => break Some(error),
            None => break None,
        };
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "cannot set TCP_NODELAY on a connection");
        }
        let watch = Watch::new(timers.header, timers.keep_alive);
        let service = TowerToHyperService::new(tracked(app.clone(), peer, watch.clone()));
        let connection = builder
            .serve_connection_with_upgrades(
                TokioIo::new(Watched::new(stream, watch.clone())),
                service,
            )
            .into_owned();
        let shutdown = shutdown.clone();
        // Until it ends, or a timer of `watch` runs out (an idle connection
        // is closed gracefully, one whose headers do not come is dropped),
        // or `shutdown` (requests in flight finish first).
        connections.spawn(async move {
            let mut connection = std::pin::pin!(connection);
            let ended = tokio::select! {
                ended = connection.as_mut() => Some(ended),
                expired = watch.expired() => match expired {
                    Expired::Header => {
                        tracing::debug!("a request's headers did not come in time; closing its connection");
                        return;
                    }
                    Expired::KeepAlive => None,
                },
                () = shutdown.cancelled() => None,
            };
            let ended = match ended {
                Some(ended) => ended,
                None => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(error) = ended {
                tracing::debug!(error = %error, "an HTTP connection ended with an error");
            }
        });
    };
    drop(listener);
    connections.close();
    connections.wait().await;
    match failed {
        None => Ok(()),
        Some(error) => Err(error),
    }
}

/// The next connection, past the accept errors that concern one connection
/// or a moment's want of descriptors or memory; `Err` when the listener
/// itself failed, `None` at `shutdown`.
async fn accept(
    listener: &TcpListener,
    shutdown: &CancellationToken,
) -> Option<std::io::Result<(TcpStream, SocketAddr)>> {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.cancelled() => return None,
        };
        let error = match accepted {
            Ok(accepted) => return Some(Ok(accepted)),
            Err(error) => error,
        };
        let Some(pause) = accept_pause(&error) else {
            return Some(Err(error));
        };
        tracing::debug!(error = %error, "accepting a connection failed");
        if !pause.is_zero() {
            tracing::warn!(error = %error, "cannot accept connections for now; pausing");
            tokio::time::sleep(pause).await;
        }
    }
}

/// `app` with the connection's peer address in each request, each request
/// in flight on `watch` until its response body is done.
fn tracked(
    app: Router,
    peer: SocketAddr,
    watch: Arc<Watch>,
) -> impl tower::Service<
    axum::http::Request<hyper::body::Incoming>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future = impl Future<Output = Result<axum::response::Response, std::convert::Infallible>> + Send,
> + Clone {
    let with_peer = with_peer(peer);
    tower::service_fn(move |request| {
        let app = app.clone();
        let flight = InFlight::start(&watch);
        let request = with_peer(request);
        async move {
            let response = app.oneshot(request).await?;
            Ok(track(flight, response))
        }
    })
}

/// Adds the connection's peer address to each of its requests, as axum's
/// `into_make_service_with_connect_info` does.
fn with_peer<B>(
    peer: SocketAddr,
) -> impl Fn(axum::http::Request<B>) -> axum::http::Request<B> + Clone {
    move |mut request| {
        request.extensions_mut().insert(ConnectInfo(peer));
        request
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_listener_ends_the_loop_and_a_failed_connection_does_not() {
        let of = |code| std::io::Error::from_raw_os_error(code);
        assert_eq!(accept_pause(&of(103)), Some(Duration::ZERO)); // ECONNABORTED
        assert!(accept_pause(&of(24)).is_some_and(|p| !p.is_zero())); // EMFILE
        assert_eq!(accept_pause(&of(22)), None); // EINVAL: the socket stopped listening
        assert_eq!(accept_pause(&of(9)), None); // EBADF
    }
}
