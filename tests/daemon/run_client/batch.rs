//! `code-runner run` to its end: what it prints, how it exits (the
//! program's code, 124 for a timeout, 64 or 69 for a refusal, 130 for
//! Ctrl-C), stdin from `--stdin -`, a busy key waited out, and a table of
//! verdicts for a job with tests.

use crate::common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::containers::docker;
use common::daemon;
use common::redis_server::RedisServer;
use common::{drain, source};
use daemon::{ChildGuard, DaemonBuilder, KEY_A, KEY_B, Role};
use reqwest::StatusCode;

use super::{client, finish, serve, text};

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
