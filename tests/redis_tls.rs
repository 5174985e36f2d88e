//! `rediss://`: the daemon talks to Redis over TLS (the redis crate's rustls
//! support), as it must to reach Upstash from outside Fly's private network.
//!
//! A real redis-server with TLS only (plain port closed) on loopback, with a
//! certificate from a CA this test makes; the daemon trusts that CA through
//! `SSL_CERT_FILE` (read by rustls-native-certs instead of the system store).

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::daemon::{self, DaemonBuilder, Role};
use common::redis_server::free_port;
use reqwest::StatusCode;

/// A CA and a server certificate for `localhost` and `127.0.0.1`, written
/// as PEM files into `dir`: `ca.pem`, `server.pem`, `server.key`.
fn write_certificates(dir: &Path) {
    let certs = common::certs::test_certs("code-runner test CA", &["localhost", "127.0.0.1"]);
    std::fs::write(dir.join("ca.pem"), certs.ca_pem).unwrap();
    std::fs::write(dir.join("server.pem"), certs.server_pem).unwrap();
    std::fs::write(dir.join("server.key"), certs.key_pem).unwrap();
}

/// A redis-server that speaks only TLS, killed by its pid when dropped.
struct TlsRedis {
    child: std::process::Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl TlsRedis {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        write_certificates(dir.path());
        let port = free_port();
        let path = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
        let child = Command::new("redis-server")
            .args(["--port", "0", "--tls-port", &port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--tls-cert-file", &path("server.pem")])
            .args(["--tls-key-file", &path("server.key")])
            .args(["--tls-ca-cert-file", &path("ca.pem")])
            .args(["--tls-auth-clients", "no"])
            .args(["--dir", &path("")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed");
        let server = Self { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.cli(&["PING"]).as_deref() != Some("PONG") {
            assert!(
                Instant::now() < deadline,
                "redis-server with TLS did not answer PING on port {port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    fn ca_file(&self) -> String {
        self.dir
            .path()
            .join("ca.pem")
            .to_string_lossy()
            .into_owned()
    }

    /// `redis-cli --tls` (a client not written here); `None` if it failed.
    fn cli(&self, args: &[&str]) -> Option<String> {
        let output = Command::new("redis-cli")
            .args(["--tls", "--cacert", &self.ca_file()])
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .ok()?;
        output
            .status
            .success()
            .then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn serve_runs_a_job_through_redis_over_tls() {
    common::init_tracing();
    let redis = TlsRedis::start();
    let url = format!("rediss://localhost:{}", redis.port);
    let server = DaemonBuilder::with_redis_url(Role::Serve, &url)
        .env("SSL_CERT_FILE", redis.ca_file())
        .start()
        .await;

    let ready = server.get("/readyz", None).await;
    assert_eq!(ready.status, StatusCode::OK, "{ready:#?}");

    let answer = server
        .submit_wait(&daemon::python("print('hello over tls')"))
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:#?}");
    assert_eq!(answer.body["status"], "succeeded", "{answer:#?}");
    assert_eq!(daemon::run_stdout(&answer.body), "hello over tls\n");

    // The job really is in the TLS server (the only one this daemon knows).
    let id = answer.id();
    assert_eq!(
        redis
            .cli(&["HGET", &format!("job:{id}"), "status"])
            .as_deref(),
        Some("succeeded")
    );
}

#[tokio::test]
async fn a_redis_certificate_from_an_unknown_ca_is_refused_with_a_clear_error() {
    common::init_tracing();
    let redis = TlsRedis::start();
    let url = format!("rediss://localhost:{}", redis.port);
    // No SSL_CERT_FILE: the system's roots do not know the test's CA.
    let empty_roots = tempfile::NamedTempFile::new().unwrap();
    let output = daemon::run_to_end(
        &["api"],
        &[
            ("CODE_RUNNER_REDIS_URL", url.as_str()),
            ("CODE_RUNNER_API_KEYS", "a:key-a-0123456789"),
            ("CODE_RUNNER_LISTEN", &format!("127.0.0.1:{}", free_port())),
            ("SSL_CERT_FILE", &empty_roots.path().to_string_lossy()),
        ],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(69), "stderr: {stderr}");
    assert!(
        stderr.contains("cannot set up attach tokens") && stderr.contains("UnknownIssuer"),
        "the error names the refused certificate: {stderr}"
    );
}

#[tokio::test]
async fn a_plain_redis_url_to_a_tls_only_server_fails_clearly() {
    common::init_tracing();
    let redis = TlsRedis::start();
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let output = daemon::run_to_end(
        &["api"],
        &[
            ("CODE_RUNNER_REDIS_URL", url.as_str()),
            ("CODE_RUNNER_API_KEYS", "a:key-a-0123456789"),
            ("CODE_RUNNER_LISTEN", &format!("127.0.0.1:{}", free_port())),
        ],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(69), "stderr: {stderr}");
    assert!(
        stderr.contains("cannot set up attach tokens"),
        "stderr: {stderr}"
    );
}
