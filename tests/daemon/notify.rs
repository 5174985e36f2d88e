//! systemd readiness (`Type=notify`, see `scripts/install`): the daemon sends
//! `READY=1` on `NOTIFY_SOCKET` once its roles are up and `STOPPING=1` when a
//! signal starts the drain. The test plays the service manager: it binds the
//! datagram socket systemd would and reads what arrives.

use crate::common;

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use common::daemon::{DaemonBuilder, Role};
use common::redis_server::RedisServer;
use reqwest::StatusCode;

/// The next datagram on `socket`, waiting up to `within` (on a blocking
/// thread: the socket is a std one).
async fn next_message(socket: &UnixDatagram, within: Duration) -> String {
    let socket = socket.try_clone().unwrap();
    tokio::task::spawn_blocking(move || {
        socket.set_read_timeout(Some(within)).unwrap();
        let mut buffer = vec![0u8; 4096];
        let n = socket
            .recv(&mut buffer)
            .unwrap_or_else(|e| panic!("no notification within {within:?}: {e}"));
        String::from_utf8_lossy(&buffer[..n]).into_owned()
    })
    .await
    .unwrap()
}

async fn ready_then_stopping(role: Role, stop: impl FnOnce(&common::daemon::Daemon)) {
    common::init_tracing();
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();

    let mut daemon = DaemonBuilder::new(role, &redis)
        .env("NOTIFY_SOCKET", path.to_string_lossy())
        .spawn();

    let ready = next_message(&socket, Duration::from_secs(60)).await;
    let lines: Vec<&str> = ready.lines().collect();
    assert_eq!(lines.first(), Some(&"READY=1"), "{ready:?}");
    let roles = match role {
        Role::Serve => "api + worker + reaper",
        Role::Worker => "worker + reaper",
        Role::Api => "api",
        Role::Reaper => "reaper",
    };
    assert!(
        lines
            .get(1)
            .is_some_and(|l| l.starts_with(&format!("STATUS={roles} listening on 127.0.0.1:"))),
        "{ready:?}"
    );
    // READY means it answers: no wait needed.
    let health = daemon.get("/healthz", None).await;
    assert_eq!(health.status, StatusCode::OK, "{health:#?}");

    stop(&daemon);
    let stopping = next_message(&socket, Duration::from_secs(30)).await;
    assert!(
        stopping.starts_with("STOPPING=1\nSTATUS=draining"),
        "{stopping:?}"
    );
    let status = daemon.wait_exit(Duration::from_secs(60)).await;
    assert_eq!(status.code(), Some(0), "log:\n{}", daemon.log());
}

#[tokio::test]
async fn serve_notifies_ready_and_stopping_on_sigterm() {
    ready_then_stopping(Role::Serve, |d| d.sigterm()).await;
}

#[tokio::test]
async fn worker_notifies_ready_and_stopping_on_sigint() {
    ready_then_stopping(Role::Worker, |d| d.sigint()).await;
}

#[tokio::test]
async fn without_notify_socket_nothing_is_sent_and_the_daemon_runs() {
    // The ordinary case (not under systemd): no error, no warning.
    common::init_tracing();
    let redis = RedisServer::start();
    let mut daemon = DaemonBuilder::new(Role::Api, &redis).start().await;
    daemon.sigterm();
    let status = daemon.wait_exit(Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(0));
    assert!(
        !daemon.log().contains("NOTIFY_SOCKET"),
        "log:\n{}",
        daemon.log()
    );
}
