//! What a redis-server was asked, as `MONITOR` prints it, for the tests
//! that check which commands the worker sends in which order.

use std::time::Duration;

use crate::common::redis_server::RedisServer;

/// What a redis-server was asked, as `MONITOR` prints it (a script's own
/// commands follow its `EVALSHA` line, each marked `[0 lua]`), until
/// [`Monitor::stop`].
pub struct Monitor {
    child: tokio::process::Child,
    lines: tokio::task::JoinHandle<Vec<String>>,
    /// What `stop` asks the server to `ECHO`: the line it prints is the last read.
    marker: String,
    redis: String,
}

impl Monitor {
    pub async fn start(redis: &RedisServer) -> Self {
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &redis.port.to_string(), "monitor"])
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("redis-cli runs");
        let mut reader = tokio::io::BufReader::new(child.stdout.take().expect("piped")).lines();
        // MONITOR answers OK once it is on.
        let first = tokio::time::timeout(Duration::from_secs(10), reader.next_line())
            .await
            .expect("MONITOR answers")
            .expect("redis-cli's output");
        assert_eq!(first.as_deref(), Some("OK"));
        let marker = format!("monitor-end-{}", uuid::Uuid::new_v4().simple());
        let end = marker.clone();
        let lines = tokio::spawn(async move {
            let mut lines = Vec::new();
            while let Ok(Some(line)) = reader.next_line().await {
                if line.contains(&end) {
                    break;
                }
                lines.push(line);
            }
            lines
        });
        Self {
            child,
            lines,
            marker,
            redis: redis.url(),
        }
    }

    /// Every command the server ran before this call: MONITOR's output
    /// comes after the commands themselves, so it reads up to a marker
    /// command sent now, which the server prints after all of them.
    pub async fn stop(mut self) -> Vec<String> {
        let client = redis::Client::open(self.redis.as_str()).expect("redis url");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("redis connects");
        let _: String = redis::cmd("ECHO")
            .arg(&self.marker)
            .query_async(&mut conn)
            .await
            .expect("ECHO");
        let lines = tokio::time::timeout(Duration::from_secs(10), &mut self.lines)
            .await
            .expect("MONITOR prints the marker")
            .expect("the reader did not panic");
        self.child.kill().await.expect("redis-cli stops");
        lines
    }
}
