//! `code-runner run`, the client, against a real `code-runner serve`: what it
//! prints, how it exits, and what it does on refusals, 429 and Ctrl-C; output
//! that appears as it is written, interactive runs (`-i`) and a stream resumed
//! after an API restart.

use crate::common;

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::containers::docker;
use common::daemon;
use common::redis_server::RedisServer;
use common::{code_runner, drain, source};
use daemon::{ChildGuard, Daemon, DaemonBuilder, KEY_A, KEY_B, Role};
use reqwest::StatusCode;

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

#[tokio::test]
async fn it_prints_the_programs_output_and_exits_with_its_code() {
    let redis = RedisServer::start();
    let daemon = serve(&redis).await;
    let dir = tempfile::tempdir().unwrap();

    let hello = source(dir.path(), "hello.py", "print('hello')\n");
    let out = finish(client(&daemon.url, Some(KEY_A), &[&hello], &[]), None).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(text(&out.stdout), "hello\n");
    assert_eq!(text(&out.stderr), "");

    let three = source(
        dir.path(),
        "three.py",
        "import sys\nprint('bye')\nprint('oops', file=sys.stderr)\nsys.exit(3)\n",
    );
    let out = finish(client(&daemon.url, Some(KEY_B), &[&three], &[]), None).await;
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(text(&out.stdout), "bye\n");
    assert_eq!(text(&out.stderr), "oops\n");

    // Flags reach the program: args, env, another entry file.
    let args = source(dir.path(), "args.sh", "echo \"$# $1 $2 $GREETING\"\n");
    let lib = source(dir.path(), "lib.txt", "unused\n");
    let out = finish(
        client(
            &daemon.url,
            Some(KEY_A),
            &[&lib, &args],
            &[
                "--language",
                "bash",
                "--entry",
                "args.sh",
                "--arg",
                "one",
                "--arg",
                "-two",
                "--env",
                "GREETING=hi",
            ],
        ),
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(text(&out.stdout), "2 one -two hi\n");

    // --json prints the job view, result included.
    let out = finish(
        client(&daemon.url, Some(KEY_A), &[&hello], &["--json"]),
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let view: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(view["status"], "succeeded");
    assert_eq!(view["result"]["run"]["stdout"], "hello\n");
    daemon.assert_no_containers(&docker().await).await;
}

#[tokio::test]
async fn a_timeout_exits_124_with_one_line_and_a_compile_error_shows_the_compiler() {
    let redis = RedisServer::start();
    let daemon = serve(&redis).await;
    let dir = tempfile::tempdir().unwrap();

    let sleep = source(dir.path(), "sleep.sh", "echo started\nsleep 100\n");
    let started = Instant::now();
    let out = finish(
        client(&daemon.url, Some(KEY_A), &[&sleep], &["--wall-ms", "2000"]),
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(124), "{out:?}");
    assert_eq!(text(&out.stdout), "started\n");
    assert_eq!(
        text(&out.stderr),
        "code-runner: program exceeded its wall time limit\n"
    );
    // The 2 s wall limit ended it, not the 100 s sleep.
    assert!(started.elapsed() < Duration::from_secs(30), "{out:?}");

    let broken = source(dir.path(), "main.c", "int main(void) { return nope; }\n");
    let out = finish(client(&daemon.url, Some(KEY_A), &[&broken], &[]), None).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(text(&out.stdout), "");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("main.c:1:25: error: ‘nope’ undeclared (first use in this function)"),
        "{stderr:?}"
    );
    assert!(
        stderr.ends_with("\ncode-runner: compilation failed (exit code 1)\n"),
        "{stderr:?}"
    );
    daemon.assert_no_containers(&docker().await).await;
}

#[tokio::test]
async fn stdin_dash_sends_the_commands_own_stdin() {
    let redis = RedisServer::start();
    let daemon = serve(&redis).await;
    let dir = tempfile::tempdir().unwrap();
    let echo = source(
        dir.path(),
        "echo.py",
        "import sys\nsys.stdout.buffer.write(sys.stdin.buffer.read())\n",
    );
    let input = "line one\nünïcode line two, no newline at the end";
    let out = finish(
        client(&daemon.url, Some(KEY_A), &[&echo], &["--stdin", "-"]),
        Some(input),
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(text(&out.stdout), input);
    assert_eq!(text(&out.stderr), "");

    let out = finish(
        client(&daemon.url, Some(KEY_A), &[&echo], &["--stdin", "given"]),
        None,
    )
    .await;
    assert_eq!(text(&out.stdout), "given");
}

#[tokio::test]
async fn refusals_exit_64_or_69_with_one_line() {
    let redis = RedisServer::start();
    let daemon = serve(&redis).await;
    let dir = tempfile::tempdir().unwrap();
    let hello = source(dir.path(), "hello.py", "print('hello')\n");

    let out = finish(client(&daemon.url, None, &[&hello], &[]), None).await;
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with("code-runner: CODE_RUNNER_API_KEY is not set")
            && stderr.lines().count() == 1,
        "{stderr:?}"
    );

    let out = finish(client(&daemon.url, Some("wrong-key"), &[&hello], &[]), None).await;
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert_eq!(text(&out.stderr), "code-runner: the API refused the key\n");

    let out = finish(
        client(
            &daemon.url,
            Some(KEY_A),
            &[&hello],
            &["--memory-mb", "999999"],
        ),
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert_eq!(
        text(&out.stderr),
        "code-runner: invalid job: limits.memory_mb: 999999 is above the server maximum of 2048\n"
    );

    let nobody = format!("http://127.0.0.1:{}", common::redis_server::free_port());
    let out = finish(client(&nobody, Some(KEY_A), &[&hello], &[]), None).await;
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with(&format!("code-runner: cannot reach {nobody}"))
            && stderr.lines().count() == 1,
        "{stderr:?}"
    );
    assert!(out.stdout.is_empty());
}

#[tokio::test]
async fn a_busy_key_is_retried_after_retry_after_until_it_is_accepted() {
    let redis = RedisServer::start();
    let daemon = DaemonBuilder::new(Role::Serve, &redis)
        .env("CODE_RUNNER_API_KEYS", format!("a:{KEY_A}:1"))
        .start()
        .await;
    let dir = tempfile::tempdir().unwrap();
    let hello = source(dir.path(), "after.py", "print('after')\n");

    // Key a's only slot is taken for about 3 s.
    let busy = daemon.submit(&daemon::sleeper(3.0)).await;
    assert_eq!(busy.status, StatusCode::ACCEPTED, "{busy:#?}");
    let busy = busy.id();
    let refused = daemon.submit(&daemon::python("print(1)")).await;
    assert_eq!(
        refused.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{refused:#?}"
    );

    let started = Instant::now();
    let out = finish(client(&daemon.url, Some(KEY_A), &[&hello], &[]), None).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(text(&out.stdout), "after\n");
    assert_eq!(text(&out.stderr), "");
    eprintln!("accepted after retrying for {:?}", started.elapsed());
    assert_eq!(daemon.job(&busy).await["status"], "succeeded");
}

#[tokio::test]
async fn ctrl_c_cancels_the_job_and_exits_130() {
    let redis = RedisServer::start();
    let daemon = serve(&redis).await;
    let docker = docker().await;
    let dir = tempfile::tempdir().unwrap();
    let forever = source(dir.path(), "forever.sh", "sleep 60\n");

    let mut guard = ChildGuard(
        client(
            &daemon.url,
            Some(KEY_A),
            &[&forever],
            &["--wall-ms", "120000"],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap(),
    );
    let child = &mut guard.0;
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());

    // The only job in this test's Redis, once it runs in a container.
    let deadline = Instant::now() + Duration::from_secs(30);
    let id = loop {
        let keys = redis.cli(&["KEYS", "job:*"]);
        let running = keys
            .lines()
            .filter_map(|k| k.strip_prefix("job:"))
            .find(|id| !id.contains(':') && redis.job_field(id, "status") == "running")
            .map(str::to_string);
        if let Some(id) = running
            && !daemon::job_containers(&docker, &id).await.is_empty()
        {
            break id;
        }
        assert!(Instant::now() < deadline, "the job never ran: {keys}");
        tokio::time::sleep(daemon::POLL).await;
    };

    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "code-runner run did not end after SIGINT"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(status.code(), Some(130));
    assert_eq!(text(&stdout.join().unwrap()), "");
    assert_eq!(
        text(&stderr.join().unwrap()),
        "code-runner: interrupted; the job was cancelled\n"
    );
    daemon
        .wait_status(&id, &["cancelled"], Duration::from_secs(15))
        .await;
    daemon.assert_no_containers(&docker).await;
}

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

#[tokio::test]
async fn run_with_tests_prints_a_table_of_verdicts_and_exits_0_only_when_all_pass() {
    let redis = RedisServer::start();
    let daemon = serve(&redis).await;
    let dir = tempfile::tempdir().unwrap();
    let sum = source(
        dir.path(),
        "sum.py",
        "a, b = map(int, input().split())\nprint(a + b)\n",
    );
    let tests = dir.path().join("tests");
    std::fs::create_dir(&tests).unwrap();
    for (name, input, output) in [
        ("01-small", "1 2\n", Some("3\n")),
        ("02-big", "40 2\n", Some("42\n")),
        ("03-free", "0 0\n", None),
    ] {
        std::fs::write(tests.join(format!("{name}.in")), input).unwrap();
        if let Some(output) = output {
            std::fs::write(tests.join(format!("{name}.out")), output).unwrap();
        }
    }
    let tests_flag = tests.to_str().unwrap();
    let out = finish(
        client(&daemon.url, Some(KEY_A), &[&sum], &["--tests", tests_flag]),
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let table = text(&out.stdout);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 5, "{table}");
    assert!(lines[0].starts_with("  #  test"), "{table}");
    assert!(lines[1].starts_with("  1  01-small  accepted "), "{table}");
    assert!(lines[3].starts_with("  3  03-free   accepted "), "{table}");
    assert_eq!(lines[4], "passed 3/3, score 3/3: accepted");

    // One wrong expected output: exit 1, and the line says where.
    std::fs::write(tests.join("02-big.out"), "41\n").unwrap();
    let out = finish(
        client(&daemon.url, Some(KEY_A), &[&sum], &["--tests", tests_flag]),
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let table = text(&out.stdout);
    assert!(
        table.contains("wrong_answer") && table.contains("line 1: expected \"41\", got \"42\""),
        "{table}"
    );
    assert!(
        table.ends_with("passed 2/3, score 2/3: wrong_answer\n"),
        "{table}"
    );

    // A directory with an .out and no .in is the user's mistake: 64.
    std::fs::write(tests.join("04-lost.out"), "x\n").unwrap();
    let out = finish(
        client(&daemon.url, Some(KEY_A), &[&sum], &["--tests", tests_flag]),
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(
        text(&out.stderr).contains("04-lost.out has no 04-lost.in"),
        "{out:?}"
    );
    daemon.assert_no_containers(&docker().await).await;
}
