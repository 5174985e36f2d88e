//! `code-runner run`, the client, against a real `code-runner serve`: what it
//! prints, how it exits, and what it does on refusals, 429 and Ctrl-C; output
//! that appears as it is written, interactive runs (`-i`) and a stream resumed
//! after an API restart. The runs to their end are in [`batch`], those
//! watched while they run in [`live`].

use crate::common;

mod batch;
mod live;

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::daemon;
use common::redis_server::RedisServer;
use common::{code_runner, drain};
use daemon::{Daemon, DaemonBuilder, Role};

/// `code-runner run FILE… FLAGS…` against `daemon` with `key`.
fn client(url: &str, key: Option<&str>, files: &[&Path], flags: &[&str]) -> Command {
    let mut command = code_runner();
    command.arg("run").args(files).args(flags);
    command.env("CODE_RUNNER_URL", url);
    if let Some(key) = key {
        command.env("CODE_RUNNER_API_KEY", key);
    }
    command
}

/// Runs the client to its end (on a blocking thread; up to 60 s).
async fn finish(mut command: Command, stdin: Option<&str>) -> Output {
    let stdin = stdin.map(str::to_owned);
    tokio::task::spawn_blocking(move || {
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        if stdin.is_some() {
            command.stdin(Stdio::piped());
        }
        let mut child = command.spawn().expect("code-runner starts");
        if let Some(text) = stdin {
            let mut pipe = child.stdin.take().unwrap();
            pipe.write_all(text.as_bytes()).unwrap();
        }
        let stdout = drain(child.stdout.take());
        let stderr = drain(child.stderr.take());
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("code-runner run did not end within 60 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Output {
            status,
            stdout: stdout.join().unwrap(),
            stderr: stderr.join().unwrap(),
        }
    })
    .await
    .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

async fn serve(redis: &RedisServer) -> Daemon {
    DaemonBuilder::new(Role::Serve, redis).start().await
}
