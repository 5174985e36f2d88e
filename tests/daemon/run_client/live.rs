//! `code-runner run` while the program runs: output that appears as it is
//! written, interactive runs (`-i`) line by line, Ctrl-C in an interactive
//! run, messages larger than the WebSocket's read buffer, and a stream
//! resumed after an API restart.

use crate::common;

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::containers::docker;
use common::daemon;
use common::redis_server::RedisServer;
use common::{drain, source};
use daemon::{ChildGuard, DaemonBuilder, KEY_A, Role};
use reqwest::StatusCode;

use super::{client, finish, serve, text};

/// A client running in the background, its stdout read line by line as it
/// comes.
struct Live {
    guard: ChildGuard,
    stdin: Option<std::process::ChildStdin>,
    lines: std::sync::mpsc::Receiver<String>,
    stdout: Vec<String>,
    stderr: Option<std::thread::JoinHandle<Vec<u8>>>,
}

impl Live {
    fn spawn(mut command: Command, interactive: bool) -> Self {
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        if interactive {
            command.stdin(Stdio::piped());
        }
        let mut child = command.spawn().expect("code-runner starts");
        let stdin = child.stdin.take();
        let stderr = Some(drain(child.stderr.take()));
        let (tx, lines) = std::sync::mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            use std::io::BufRead as _;
            let mut reader = std::io::BufReader::new(stdout);
            loop {
                let mut line = String::new();
                match reader.read_line(&mut line) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {
                        if tx.send(line).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Self {
            guard: ChildGuard(child),
            stdin,
            lines,
            stdout: Vec::new(),
            stderr,
        }
    }

    /// The next line of the client's stdout, within `within`.
    async fn line(&mut self, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            match self.lines.try_recv() {
                Ok(line) => {
                    self.stdout.push(line.clone());
                    return line;
                }
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    panic!("the client's stdout ended; it printed {:?}", self.stdout)
                }
                Err(std::sync::mpsc::TryRecvError::Empty) => {}
            }
            assert!(
                Instant::now() < deadline,
                "no line within {within:?}; so far {:?}",
                self.stdout
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn type_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("an interactive client");
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.flush().unwrap();
    }

    fn still_running(&mut self) -> bool {
        self.guard.0.try_wait().unwrap().is_none()
    }

    /// Waits (up to `within`) for the client to end; its exit code, the
    /// rest of its stdout and its stderr.
    async fn end(mut self, within: Duration) -> (Option<i32>, String, String) {
        let deadline = Instant::now() + within;
        let status = loop {
            if let Some(status) = self.guard.0.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "code-runner run did not end within {within:?}; printed {:?}",
                self.stdout
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let rest: String = self.lines.iter().collect();
        let stderr = self.stderr.take().unwrap().join().unwrap();
        (status.code(), rest, text(&stderr))
    }
}

/// The first line of a job may wait for a container to start.
const FIRST_LINE: Duration = Duration::from_secs(30);
const NEXT_LINE: Duration = Duration::from_secs(10);

#[tokio::test]
async fn interactive_run_echoes_each_line_before_the_next_is_typed() {
    let redis = RedisServer::start();
    let daemon = serve(&redis).await;
    let dir = tempfile::tempdir().unwrap();
    let echo = source(
        dir.path(),
        "echo.py",
        "while True:\n    try:\n        line = input()\n    except EOFError:\n        break\n    print(f'echo: {line}', flush=True)\nprint('eof', flush=True)\n",
    );

    let mut live = Live::spawn(client(&daemon.url, Some(KEY_A), &[&echo], &["-i"]), true);
    live.type_line("hello\n");
    assert_eq!(live.line(FIRST_LINE).await, "echo: hello\n");
    // The reply came while the program still waits for more.
    assert!(live.still_running());
    live.type_line("ünïcode 2\n");
    assert_eq!(live.line(NEXT_LINE).await, "echo: ünïcode 2\n");
    assert!(live.still_running());
    // EOF (Ctrl-D on a terminal): stdin_close, the program ends.
    drop(live.stdin.take());
    assert_eq!(live.line(NEXT_LINE).await, "eof\n");
    let (code, rest, stderr) = live.end(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0), "stderr: {stderr}");
    assert_eq!(rest, "", "nothing is written twice");
    assert_eq!(stderr, "");
    daemon.assert_no_containers(&docker().await).await;
}

#[tokio::test]
async fn interactive_run_exits_with_the_programs_code_without_waiting_for_eof() {
    let redis = RedisServer::start();
    let daemon = serve(&redis).await;
    let dir = tempfile::tempdir().unwrap();
    let three = source(
        dir.path(),
        "three.py",
        "import sys\nname = input()\nprint(f'bye {name}', flush=True)\nsys.exit(3)\n",
    );

    let mut live = Live::spawn(client(&daemon.url, Some(KEY_A), &[&three], &["-i"]), true);
    live.type_line("you\n");
    assert_eq!(live.line(FIRST_LINE).await, "bye you\n");
    // Stdin stays open: the client ends with the program all the same.
    let (code, rest, stderr) = live.end(Duration::from_secs(30)).await;
    assert_eq!(code, Some(3), "stderr: {stderr}");
    assert_eq!(rest, "");
    assert_eq!(stderr, "");

    // -i and --stdin do not go together.
    let out = finish(
        client(&daemon.url, Some(KEY_A), &[&three], &["-i", "--stdin", "x"]),
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(text(&out.stderr).contains("cannot be used with"), "{out:?}");
}

/// The WebSocket's ends read 8 KiB at a time (`WS_READ_BUFFER_BYTES`): an
/// event of 32 KiB of output, and a stdin line of 40 KiB, are each read
/// whole across several reads, and nothing is lost or reordered.
#[tokio::test]
async fn messages_larger_than_the_websockets_read_buffer_arrive_whole() {
    let redis = RedisServer::start();
    let daemon = serve(&redis).await;
    let dir = tempfile::tempdir().unwrap();
    let big = source(
        dir.path(),
        "big.py",
        "import sys\n\
         line = sys.stdin.readline()\n\
         sys.stdout.write(''.join(chr(97 + i % 26) for i in range(200000)))\n\
         sys.stdout.write('|%d|%s' % (len(line), line[-3:]))\n",
    );
    let typed = format!("{}end\n", "x".repeat(40 * 1024));
    let out = finish(
        client(&daemon.url, Some(KEY_A), &[&big], &["-i"]),
        Some(&typed),
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let expected: String = (0..200_000u32)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect::<String>()
        + &format!("|{}|nd\n", typed.len());
    let stdout = text(&out.stdout);
    assert_eq!(
        stdout.len(),
        expected.len(),
        "{}",
        &stdout[stdout.len().saturating_sub(80)..]
    );
    assert!(
        stdout == expected,
        "the output differs from what the program wrote"
    );
    assert_eq!(text(&out.stderr), "");
}

#[tokio::test]
async fn output_appears_while_the_program_still_runs() {
    let redis = RedisServer::start();
    let daemon = serve(&redis).await;
    let dir = tempfile::tempdir().unwrap();
    let slow = source(
        dir.path(),
        "slow.py",
        "import time\nprint('first', flush=True)\ntime.sleep(3)\nprint('second')\n",
    );

    let mut live = Live::spawn(client(&daemon.url, Some(KEY_A), &[&slow], &[]), false);
    assert_eq!(live.line(FIRST_LINE).await, "first\n");
    assert!(
        live.still_running(),
        "`first` only appeared once the client had ended"
    );
    let (code, rest, stderr) = live.end(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0), "stderr: {stderr}");
    assert_eq!(rest, "second\n", "nothing lost, nothing written twice");
    assert_eq!(stderr, "");
}

#[tokio::test]
async fn ctrl_c_in_an_interactive_run_interrupts_the_program_and_twice_kills_it() {
    let redis = RedisServer::start();
    let daemon = serve(&redis).await;
    let dir = tempfile::tempdir().unwrap();
    let sigint = |live: &Live| {
        let pid = nix::unistd::Pid::from_raw(live.guard.0.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    };

    // One Ctrl-C: KeyboardInterrupt in the program, which says so and exits 7.
    let caught = source(
        dir.path(),
        "caught.py",
        "import sys\ntry:\n    print('ready', flush=True)\n    input()\nexcept KeyboardInterrupt:\n    print('caught', flush=True)\n    sys.exit(7)\n",
    );
    let mut live = Live::spawn(client(&daemon.url, Some(KEY_A), &[&caught], &["-i"]), true);
    assert_eq!(live.line(FIRST_LINE).await, "ready\n");
    sigint(&live);
    assert_eq!(live.line(NEXT_LINE).await, "caught\n");
    let (code, rest, stderr) = live.end(Duration::from_secs(30)).await;
    assert_eq!(code, Some(7), "stderr: {stderr}");
    assert_eq!(rest, "");
    assert_eq!(stderr, "", "the job was not cancelled");

    // A program that ignores SIGINT: the second Ctrl-C within 2 s kills it.
    let stubborn = source(
        dir.path(),
        "stubborn.py",
        "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('ready', flush=True)\ntime.sleep(60)\n",
    );
    let mut live = Live::spawn(
        client(&daemon.url, Some(KEY_A), &[&stubborn], &["-i"]),
        true,
    );
    assert_eq!(live.line(FIRST_LINE).await, "ready\n");
    sigint(&live);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(live.still_running(), "one Ctrl-C is only an interrupt");
    sigint(&live);
    let (code, rest, stderr) = live.end(Duration::from_secs(30)).await;
    assert_eq!(code, Some(137), "stderr: {stderr}");
    assert_eq!(rest, "");
    daemon.assert_no_containers(&docker().await).await;
}

#[tokio::test]
async fn a_stream_cut_by_an_api_restart_resumes_without_losing_or_repeating_output() {
    let redis = RedisServer::start();
    let worker = DaemonBuilder::new(Role::Worker, &redis).start().await;
    let listen = format!("127.0.0.1:{}", common::redis_server::free_port());
    let url = format!("http://{listen}");
    let api = |redis: &RedisServer| {
        DaemonBuilder::new(Role::Api, redis)
            .env("CODE_RUNNER_LISTEN", &listen)
            .spawn()
    };
    let healthy = async |url: &str| {
        let http = daemon::http_client();
        let deadline = Instant::now() + daemon::STARTUP;
        loop {
            if let Ok(answer) = http.get(format!("{url}/healthz")).send().await
                && answer.status() == StatusCode::OK
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the API did not come up at {url}"
            );
            tokio::time::sleep(daemon::POLL).await;
        }
    };
    let mut first_api = api(&redis);
    healthy(&url).await;

    let dir = tempfile::tempdir().unwrap();
    let slow = source(
        dir.path(),
        "slow.py",
        "import time\nprint('one', flush=True)\ntime.sleep(4)\nprint('two', flush=True)\ntime.sleep(1)\nprint('three')\n",
    );
    let mut command = client(&url, Some(KEY_A), &[&slow], &[]);
    command.env("CODE_RUNNER_LOG", "code_runner=debug");
    let mut live = Live::spawn(command, false);
    assert_eq!(live.line(FIRST_LINE).await, "one\n");

    // The API dies mid-run and another takes its place on the same address.
    first_api.kill9().await;
    let _second_api = api(&redis);
    healthy(&url).await;

    assert_eq!(live.line(NEXT_LINE).await, "two\n");
    let (code, rest, stderr) = live.end(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0), "stderr: {stderr}");
    assert_eq!(rest, "three\n", "nothing lost, nothing repeated");
    assert!(stderr.contains("reconnecting"), "{stderr}");
    assert!(!stderr.contains("by polling"), "{stderr}");
    worker.assert_no_containers(&docker().await).await;
}
