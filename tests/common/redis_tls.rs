//! A redis-server of one test that speaks only TLS (its plain port
//! closed), on loopback, with a certificate from a CA the test makes: for
//! the tests of `rediss://` URLs.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::redis_server::free_port;

/// A CA and a server certificate for `localhost` and `127.0.0.1`, written
/// as PEM files into `dir`: `ca.pem`, `server.pem`, `server.key`.
fn write_certificates(dir: &Path) {
    let certs = super::certs::test_certs("code-runner test CA", &["localhost", "127.0.0.1"]);
    std::fs::write(dir.join("ca.pem"), certs.ca_pem).unwrap();
    std::fs::write(dir.join("server.pem"), certs.server_pem).unwrap();
    std::fs::write(dir.join("server.key"), certs.key_pem).unwrap();
}

/// A redis-server that speaks only TLS, killed by its pid when dropped.
pub struct TlsRedis {
    child: std::process::Child,
    pub port: u16,
    dir: tempfile::TempDir,
}

impl TlsRedis {
    pub fn start() -> Self {
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

    pub fn ca_file(&self) -> String {
        self.dir
            .path()
            .join("ca.pem")
            .to_string_lossy()
            .into_owned()
    }

    /// `redis-cli --tls` (a client not written here); `None` if it failed.
    pub fn cli(&self, args: &[&str]) -> Option<String> {
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
