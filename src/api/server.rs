//! The HTTP server loop under the API and the ops endpoints: hyper with a
//! header read timeout, which also closes a keep-alive connection that
//! stays idle between requests that long (a client that opens connections
//! and sends nothing cannot hold them), and a graceful shutdown that lets
//! requests in flight finish. axum's own `serve` sets no timer, so no
//! timeout; this loop is the same hyper builder with one.
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

use axum::Router;
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

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

/// Serves `app` on `listener` until `shutdown`, then waits for the
/// connections in flight to finish their requests. `Err` when the listener
/// failed.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    shutdown: CancellationToken,
    header_timeout: Duration,
) -> std::io::Result<()> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(HTTP2_KEEP_ALIVE)
        .keep_alive_timeout(header_timeout);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let failed = loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.cancelled() => break None,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => match accept_pause(&error) {
                Some(pause) => {
                    tracing::debug!(error = %error, "accepting a connection failed");
                    if !pause.is_zero() {
                        tracing::warn!(error = %error, "cannot accept connections for now; pausing");
                        tokio::time::sleep(pause).await;
                    }
                    continue;
                }
                None => break Some(error),
            },
        };
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "cannot set TCP_NODELAY on a connection");
        }
        let service = TowerToHyperService::new(app.clone().map_request(with_peer(peer)));
        let connection = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service)
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(error = %error, "an HTTP connection ended with an error");
            }
        });
    };
    drop(listener);
    graceful.shutdown().await;
    match failed {
        None => Ok(()),
        Some(error) => Err(error),
    }
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
