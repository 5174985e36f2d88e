//! `input_wanted`: an interactive job's sandbox says when a process of the
//! job waits for its stdin with nothing buffered for it — once per wait,
//! after the prompt written before it — under runc and under gVisor, cold
//! and on a warm runtime; never while the job computes or sleeps, never
//! after stdin is closed, never for a job that is not interactive.
//!
//! Each test converses with a real sandbox: it answers each `input_wanted`
//! with the next line, and asserts the exact transcript.

use crate::common;

use std::time::Duration;

use code_runner::job::{JobSpec, StartKind, Status};
use code_runner::sandbox::{JobInput, JobIo, SandboxEvent};
use common::{Harness, job, runsc_harness};
use tokio::time::Instant;

const DEADLINE: Duration = Duration::from_secs(60);

/// Answering a wait with this closes stdin instead (Ctrl-D at a terminal).
const CLOSE: &str = "\u{4}";

/// Runs `spec` interactively; answers the n-th `input_wanted` with
/// `answers[n]` ([`CLOSE`]: closes stdin), or with `up_front` sends every
/// answer and closes stdin as the job starts. Returns the transcript: `out:<text>` (adjacent stdout
/// joined), `err:<text>`, `wanted`, then `status:<status> exit:<code>`.
async fn converse(
    harness: &Harness,
    spec: JobSpec,
    answers: &[&str],
    up_front: bool,
) -> Vec<String> {
    let spec = JobSpec {
        interactive: true,
        ..spec
    };
    let (events, mut events_rx) = tokio::sync::mpsc::channel(64);
    let (input, input_rx) = tokio::sync::mpsc::channel(8);
    let io = JobIo {
        events: Some(events),
        input: Some(input_rx),
        ..Default::default()
    };
    if up_front {
        for answer in answers {
            let line = format!("{answer}\n").into_bytes();
            input.send(JobInput::Stdin(line)).await.unwrap();
        }
        input.send(JobInput::StdinClose).await.unwrap();
    }
    let answers: &[&str] = if up_front { &[] } else { answers };
    let run = harness.run_io(&spec, io);
    let talk = async {
        let mut transcript: Vec<String> = Vec::new();
        let mut answers = answers.iter();
        let mut started = false;
        let deadline = Instant::now() + DEADLINE;
        loop {
            let event = tokio::time::timeout_at(deadline, events_rx.recv())
                .await
                .unwrap_or_else(|_| panic!("no end within {DEADLINE:?}: {transcript:?}"));
            let Some(event) = event else { break };
            let (tag, text) = match event {
                SandboxEvent::StageStart { stage } => {
                    started = stage == "run";
                    continue;
                }
                SandboxEvent::Stdout(data) if started => ("out:", data),
                SandboxEvent::Stderr(data) if started => ("err:", data),
                SandboxEvent::InputWanted => {
                    transcript.push("wanted".into());
                    if let Some(answer) = answers.next() {
                        let frame = if *answer == CLOSE {
                            JobInput::StdinClose
                        } else {
                            JobInput::Stdin(format!("{answer}\n").into_bytes())
                        };
                        input.send(frame).await.unwrap();
                    }
                    continue;
                }
                _ => continue,
            };
            let text = String::from_utf8_lossy(&text).into_owned();
            match transcript.last_mut() {
                Some(last) if last.starts_with(tag) => last.push_str(&text),
                _ => transcript.push(format!("{tag}{text}")),
            }
        }
        transcript
    };
    let (result, mut transcript) = tokio::join!(run, talk);
    let run = result.run.as_ref();
    transcript.push(format!(
        "status:{:?} exit:{:?}",
        result.status,
        run.and_then(|r| r.exit_code)
    ));
    transcript
}

/// The two-question conversation every language below has.
const TWO_QUESTIONS: [&str; 6] = [
    "out:name? ",
    "wanted",
    "out:hi ada\nage? ",
    "wanted",
    "out:ada is 42\n",
    "status:Succeeded exit:Some(0)",
];

fn python_input() -> JobSpec {
    job(
        "python",
        "main.py",
        "name = input('name? ')\nage = input(f'hi {name}\\nage? ')\nprint(f'{name} is {age}')\n",
    )
}

fn c_scanf() -> JobSpec {
    job(
        "c",
        "main.c",
        r#"#include <stdio.h>
int main(void) {
    char name[64];
    int age;
    printf("name? ");
    fflush(stdout);
    if (scanf("%63s", name) != 1) return 1;
    printf("hi %s\nage? ", name);
    fflush(stdout);
    if (scanf("%d", &age) != 1) return 2;
    printf("%s is %d\n", name, age);
    return 0;
}
"#,
    )
}

fn node_readline() -> JobSpec {
    // It exits at once: a paused stdin left in libuv's epoll set would
    // count as a wait (see crates/init/src/watch.rs).
    job(
        "javascript",
        "main.js",
        "const rl = require('readline').createInterface({ input: process.stdin });\n\
         process.stdout.write('name? ');\n\
         rl.once('line', (name) => {\n\
           process.stdout.write(`hi ${name}\\nage? `);\n\
           rl.once('line', (age) => { console.log(`${name} is ${age}`); process.exit(0); });\n\
         });\n",
    )
}

async fn python_input_is_said_after_each_prompt(harness: Harness) {
    let transcript = converse(&harness, python_input(), &["ada", "42"], false).await;
    assert_eq!(transcript, TWO_QUESTIONS);
    harness.assert_clean().await;
}

async fn c_scanf_is_said_after_each_prompt(harness: Harness) {
    let transcript = converse(&harness, c_scanf(), &["ada", "42"], false).await;
    assert_eq!(transcript, TWO_QUESTIONS);
    harness.assert_clean().await;
}

async fn node_readline_is_said_after_each_prompt(harness: Harness) {
    let transcript = converse(&harness, node_readline(), &["ada", "42"], false).await;
    assert_eq!(transcript, TWO_QUESTIONS);
    harness.assert_clean().await;
}

async fn nothing_is_said_while_the_job_computes_or_sleeps(harness: Harness) {
    // It computes and sleeps, then reads a line and reads to the end: the
    // line and the end of stdin were sent as it started, so neither read
    // waits (the second finds EOF), and nothing is said at all.
    let spec = job(
        "python",
        "main.py",
        "import sys, time\nn = sum(i * i for i in range(2_000_000))\nprint('computed', n % 7, flush=True)\n\
         time.sleep(0.5)\nprint('slept', flush=True)\nline = sys.stdin.readline()\nprint('got', line.strip(), flush=True)\n\
         rest = sys.stdin.read()\ntime.sleep(0.3)\nprint('end', repr(rest))\n",
    );
    let transcript = converse(&harness, spec, &["x"], true).await;
    assert_eq!(
        transcript,
        [
            "out:computed 1\nslept\ngot x\nend ''\n",
            "status:Succeeded exit:Some(0)"
        ]
    );
    harness.assert_clean().await;
}

async fn nothing_is_said_once_stdin_is_closed(harness: Harness) {
    // It waits, the student closes stdin (Ctrl-D); every read after that
    // finds the end of stdin, and none is a wait.
    let spec = job(
        "python",
        "main.py",
        "import sys, time\nprint('x? ', end='', flush=True)\nfirst = sys.stdin.read()\n\
         time.sleep(0.3)\nsecond = sys.stdin.read()\nline = sys.stdin.readline()\n\
         print(repr(first), repr(second), repr(line))\n",
    );
    let transcript = converse(&harness, spec, &[CLOSE], false).await;
    assert_eq!(
        transcript,
        [
            "out:x? ",
            "wanted",
            "out:'' '' ''\n",
            "status:Succeeded exit:Some(0)"
        ]
    );
    harness.assert_clean().await;
}

async fn a_job_that_is_not_interactive_says_nothing(harness: Harness) {
    let spec = JobSpec {
        stdin: "ada\n42\n".into(),
        ..python_input()
    };
    let (events, mut events_rx) = tokio::sync::mpsc::channel(64);
    let io = JobIo {
        events: Some(events),
        ..Default::default()
    };
    let result = harness.run_io(&spec, io).await;
    assert_eq!(result.status, Status::Succeeded, "{result:#?}");
    assert_eq!(common::stdout(&result), "name? hi ada\nage? ada is 42\n");
    let mut wanted = 0;
    while let Ok(event) = events_rx.try_recv() {
        wanted += usize::from(matches!(event, SandboxEvent::InputWanted));
    }
    assert_eq!(wanted, 0);
    harness.assert_clean().await;
}

macro_rules! per_runtime_and_path {
    ($($name:ident),+ $(,)?) => {
        mod runc {
            use super::*;
            $(#[tokio::test]
            async fn $name() {
                super::$name(Harness::new().await).await;
            })+
            /// With the language's runtime started ahead.
            mod warm_runtime {
                use super::*;
                $(#[tokio::test]
                async fn $name() {
                    super::super::$name(Harness::new().await.on(StartKind::WarmRuntime)).await;
                })+
            }
        }
        mod runsc {
            use super::*;
            $(#[tokio::test]
            async fn $name() {
                if let Some(harness) = runsc_harness(stringify!($name)).await {
                    super::$name(harness).await;
                }
            })+
            mod warm_runtime {
                use super::*;
                $(#[tokio::test]
                async fn $name() {
                    if let Some(harness) = runsc_harness(stringify!($name)).await {
                        super::super::$name(harness.on(StartKind::WarmRuntime)).await;
                    }
                })+
            }
        }
    };
}

per_runtime_and_path!(
    python_input_is_said_after_each_prompt,
    c_scanf_is_said_after_each_prompt,
    node_readline_is_said_after_each_prompt,
    nothing_is_said_while_the_job_computes_or_sleeps,
    nothing_is_said_once_stdin_is_closed,
    a_job_that_is_not_interactive_says_nothing,
);
