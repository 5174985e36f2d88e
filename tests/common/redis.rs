//! A redis-server of one test only: a child process on a free loopback port,
//! with no persistence of its own unless the test gives its settings
//! ([`RedisServer::start_with`], e.g. the AOF settings of scripts/up), killed
//! by its pid when dropped (also when the test fails).
//!
//! Its data directory is a temporary one, so [`RedisServer::stop`]
//! (`SHUTDOWN SAVE`) and [`RedisServer::restart`] on the same port keep the
//! data: an outage that loses nothing.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a redis-server may take to answer PING after it started.
const READY: Duration = Duration::from_secs(10);
/// How long a redis-server may take to exit after `SHUTDOWN`.
const STOPPED: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(20);

/// A loopback port nothing listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    dir: tempfile::TempDir,
    /// The persistence and memory settings it runs with.
    args: Vec<String>,
}

impl RedisServer {
    /// Starts a redis-server on a free loopback port and waits until it
    /// answers PING. Another process may take the port between choosing it
    /// and the bind: tries a few.
    pub fn start() -> Self {
        Self::start_with(&["--save", "", "--appendonly", "no"])
    }

    /// Like [`Self::start`], on `port` (chosen by the caller, who has
    /// pointed something at it before the server exists).
    #[allow(dead_code)] // not every test binary asks
    pub fn start_on(port: u16) -> Self {
        let mut server = Self {
            child: None,
            port,
            dir: tempfile::tempdir().expect("a temporary directory"),
            args: ["--save", "", "--appendonly", "no"]
                .map(String::from)
                .to_vec(),
        };
        assert!(server.spawn(), "redis-server did not start on port {port}");
        server
    }

    /// Like [`Self::start`], with these settings instead of none.
    pub fn start_with(args: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut server = Self {
            child: None,
            port: 0,
            dir,
            args: args.iter().map(|a| a.to_string()).collect(),
        };
        for _ in 0..5 {
            server.port = free_port();
            if server.spawn() {
                return server;
            }
            // The port was taken meanwhile: try another.
        }
        panic!("redis-server did not start on any of 5 free ports");
    }

    /// Starts the server on `self.port`; `false` if it exited at once (the
    /// port is taken). Fails the test if it does not answer PING in time.
    fn spawn(&mut self) -> bool {
        let mut child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(&self.args)
            .arg("--dir")
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed (apt-get install redis-server)");
        let deadline = Instant::now() + READY;
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                return false;
            }
            if self.ping() {
                self.child = Some(child);
                return true;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "redis-server on port {} did not answer PING within {READY:?}",
                    self.port
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// A client of the server. Like the daemon's, its connections send no
    /// `CLIENT SETINFO`, which Redis before 7.2 counts as an error: the
    /// server's error counts are the daemon's alone.
    fn client(&self) -> redis::RedisResult<redis::Client> {
        let info = redis::IntoConnectionInfo::into_connection_info(self.url())?;
        let settings = info.redis_settings().clone().set_skip_set_lib_name();
        redis::Client::open(info.set_redis_settings(settings))
    }

    fn ping(&self) -> bool {
        self.client()
            .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(1)))
            .and_then(|mut conn| redis::cmd("PING").query::<String>(&mut conn))
            .is_ok()
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's data directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A connection to the server.
    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        self.client()
            .expect("redis url")
            .get_multiplexed_async_connection()
            .await
            .expect("the test's redis-server answers")
    }

    /// A connection that waits up to `timeout` for an answer (the client's
    /// default is half a second): for a script that takes long on a loaded
    /// machine.
    pub async fn patient_conn(
        &self,
        timeout: std::time::Duration,
    ) -> redis::aio::MultiplexedConnection {
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(timeout));
        self.client()
            .expect("redis url")
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .expect("the test's redis-server answers")
    }

    /// Runs `redis-cli -p <port> ARGS…` and returns its output, trimmed.
    pub fn cli(&self, args: &[&str]) -> String {
        let output = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli runs");
        assert!(output.status.success(), "redis-cli {args:?}: {output:?}");
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    }

    /// Field `name` of the server's `INFO section` (e.g. `stats`,
    /// `total_connections_received`).
    pub fn info(&self, section: &str, name: &str) -> String {
        self.info_field(section, name)
            .unwrap_or_else(|| panic!("INFO {section} has no {name}"))
    }

    /// Calls of `command` the server has served since its stats were last
    /// reset (`INFO commandstats`; 0 when none).
    pub fn calls(&self, command: &str) -> u64 {
        self.info_field("commandstats", &format!("cmdstat_{command}"))
            .map_or(0, |stats| {
                stats
                    .strip_prefix("calls=")
                    .and_then(|rest| rest.split(',').next())
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("cmdstat_{command} has no calls: {stats}"))
            })
    }

    /// The value of field `name` in `INFO section`, if it has one.
    fn info_field(&self, section: &str, name: &str) -> Option<String> {
        self.cli(&["INFO", section]).lines().find_map(|line| {
            line.trim()
                .strip_prefix(&format!("{name}:"))
                .map(str::to_string)
        })
    }

    /// A field of the `job:<id>` hash (empty when absent), for a daemon
    /// with the default key prefix.
    pub fn job_field(&self, id: &str, field: &str) -> String {
        self.cli(&["HGET", &format!("job:{id}"), field])
    }

    /// The stored result of a job (default key prefix), as JSON, with its
    /// output (stored raw beside it; here UTF-8 text) put back.
    pub fn stored_result(&self, id: &str) -> serde_json::Value {
        let text = self.job_field(id, "result");
        let mut result: serde_json::Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("result of {id} ({e}): {text:?}"));
        for stage in ["compile", "run"] {
            for stream in ["stdout", "stderr"] {
                if result[stage].is_object() {
                    let output: Option<Vec<u8>> = self
                        .client()
                        .and_then(|client| client.get_connection())
                        .and_then(|mut conn| {
                            redis::cmd("HGET")
                                .arg(format!("job:{id}"))
                                .arg(format!("out:{stage}:{stream}"))
                                .query(&mut conn)
                        })
                        .expect("the test's redis-server answers");
                    result[stage][stream] = serde_json::Value::String(
                        String::from_utf8_lossy(&output.unwrap_or_default()).into_owned(),
                    );
                }
            }
        }
        result
    }

    /// `LLEN jobs:queue`, for a daemon with the default key prefix.
    pub fn queue_depth(&self) -> u64 {
        self.cli(&["LLEN", "jobs:queue"])
            .parse()
            .expect("LLEN answers a number")
    }

    /// Stops the server after it saved its data (an outage that loses
    /// nothing: [`Self::restart`] loads it again).
    pub fn stop(&mut self) {
        let mut child = self.child.take().expect("the server is running");
        // The server closes the connection instead of answering.
        if let Ok(mut conn) = self
            .client()
            .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(1)))
        {
            let _ = redis::cmd("SHUTDOWN").arg("SAVE").query::<()>(&mut conn);
        }
        let deadline = Instant::now() + STOPPED;
        while child.try_wait().expect("wait for redis-server").is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("redis-server did not shut down");
            }
            std::thread::sleep(POLL);
        }
    }

    /// Starts the server again on the same port, with the saved data.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "the server is still running");
        assert!(self.spawn(), "redis-server did not restart");
    }

    /// Kills the server (SIGKILL, by its pid): an outage without a save.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
