//! `input_wanted`: said once per wait when a process of a watched stage
//! waits for its stdin with nothing buffered, after the output written
//! before the wait; never while the stage computes or sleeps, never for a
//! read of another file on descriptor 0, never after stdin is closed.

use std::time::{Duration, Instant};

use code_runner_protocol::{HostMessage, SandboxMessage, StageSpec};

use super::harness::{Sandbox, file};

const T: Duration = Duration::from_secs(20);

/// What the stage said, in order: `out:<text>` for stdout (chunks joined
/// until the next other message), `err:<text>`, `wanted`, `end:<exit code>`.
fn transcript(messages: &[SandboxMessage]) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for message in messages {
        let (tag, text) = match message {
            SandboxMessage::Stdout(data) => ("out:", String::from_utf8_lossy(data).into_owned()),
            SandboxMessage::Stderr(data) => ("err:", String::from_utf8_lossy(data).into_owned()),
            SandboxMessage::InputWanted => {
                lines.push("wanted".into());
                continue;
            }
            SandboxMessage::StageEnd(report) => {
                lines.push(format!("end:{:?}", report.exit_code));
                continue;
            }
            _ => continue,
        };
        match lines.last_mut() {
            Some(last) if last.starts_with(tag) => last.push_str(&text),
            _ => lines.push(format!("{tag}{text}")),
        }
    }
    lines
}

fn watched(sb: &Sandbox, argv: &[&str]) -> StageSpec {
    let mut stage = sb.stage("run", argv);
    stage.stdin = true;
    stage.watch_input = true;
    stage
}

/// Reads frames until `input_wanted`; panics after `timeout`.
fn wait_for_wanted(sb: &mut Sandbox, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if sb.next(left) == SandboxMessage::InputWanted {
            return;
        }
    }
}

/// A prompt, a wait, an answer, a second wait, an answer: each wait is said
/// once, after its prompt, and the answers come after the input.
fn two_questions(argv: &[&str], files: Vec<code_runner_protocol::BundleFile>) {
    let mut sb = Sandbox::start();
    let stage = watched(&sb, argv);
    sb.send(sb.bundle(files, vec![stage]));
    wait_for_wanted(&mut sb, T);
    sb.send(HostMessage::Stdin(b"ada\n".to_vec()));
    wait_for_wanted(&mut sb, T);
    sb.send(HostMessage::Stdin(b"42\n".to_vec()));
    let outcome = sb.finish(T);
    assert_eq!(
        transcript(&outcome.messages),
        [
            "out:name? ",
            "wanted",
            "out:hi ada\nage? ",
            "wanted",
            "out:ada is 42\n",
            "end:Some(0)"
        ],
        "{}",
        outcome.diagnostics
    );
}

#[test]
fn a_shell_read_is_said_after_its_prompt() {
    two_questions(
        &[
            "sh",
            "-c",
            "printf 'name? '; read name; printf 'hi %s\\nage? ' \"$name\"; read age; echo \"$name is $age\"",
        ],
        vec![],
    );
}

#[test]
fn python_input_is_said_after_its_prompt() {
    two_questions(
        &["/usr/bin/python3", "main.py"],
        vec![file(
            "main.py",
            b"name = input('name? ')\nage = input(f'hi {name}\\nage? ')\nprint(f'{name} is {age}')\n",
            false,
        )],
    );
}

/// (It exits at once: a paused stdin still in libuv's epoll set would count
/// as waiting, see `watch`.)
#[test]
fn node_readline_is_said_after_its_prompt() {
    two_questions(
        &["/usr/bin/node", "main.js"],
        vec![file(
            "main.js",
            b"const rl = require('readline').createInterface({ input: process.stdin });\n\
              process.stdout.write('name? ');\n\
              rl.once('line', (name) => {\n\
                process.stdout.write(`hi ${name}\\nage? `);\n\
                rl.once('line', (age) => { console.log(`${name} is ${age}`); process.exit(0); });\n\
              });\n",
            false,
        )],
    );
}

#[test]
fn a_reader_in_a_child_process_is_said_too() {
    // `head` is a child of the shell; the shell itself only waits for it.
    let mut sb = Sandbox::start();
    let stage = watched(&sb, &["sh", "-c", "printf 'line? '; head -n 1; echo after"]);
    sb.send(sb.bundle(vec![], vec![stage]));
    wait_for_wanted(&mut sb, T);
    sb.send(HostMessage::Stdin(b"typed\n".to_vec()));
    let outcome = sb.finish(T);
    assert_eq!(
        transcript(&outcome.messages),
        ["out:line? ", "wanted", "out:typed\nafter\n", "end:Some(0)"],
        "{}",
        outcome.diagnostics
    );
}

#[test]
fn nothing_is_said_while_the_stage_computes_sleeps_or_reads_a_file() {
    let mut sb = Sandbox::start();
    let stage = watched(
        &sb,
        &[
            "sh",
            "-c",
            "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; echo computed; sleep 0.3; \
             while read line; do echo \"file: $line\"; done < data.txt; sleep 0.3; echo slept",
        ],
    );
    sb.send(sb.bundle(vec![file("data.txt", b"a\nb\n", false)], vec![stage]));
    let outcome = sb.finish(T);
    assert_eq!(
        transcript(&outcome.messages),
        ["out:computed\nfile: a\nfile: b\nslept\n", "end:Some(0)"],
        "{}",
        outcome.diagnostics
    );
}

#[test]
fn nothing_is_said_after_stdin_is_closed_nor_with_input_already_there() {
    let mut sb = Sandbox::start();
    // A first stage that takes no stdin keeps the watched one from
    // starting until the input and the close are surely queued for it.
    let first = sb.stage("compile", &["sleep", "0.3"]);
    let stage = watched(
        &sb,
        &[
            "sh",
            "-c",
            "read a; echo \"got $a\"; cat; sleep 0.2; echo end",
        ],
    );
    sb.send(sb.bundle(vec![], vec![first, stage]));
    sb.send(HostMessage::Stdin(b"one\ntwo\n".to_vec()));
    sb.send(HostMessage::StdinClose);
    let outcome = sb.finish(T);
    assert_eq!(
        transcript(&outcome.messages),
        ["end:Some(0)", "out:got one\ntwo\nend\n", "end:Some(0)"],
        "{}",
        outcome.diagnostics
    );
}

#[test]
fn an_unwatched_stage_says_nothing() {
    let mut sb = Sandbox::start();
    let mut stage = watched(&sb, &["sh", "-c", "printf 'x? '; read x; echo \"x=$x\""]);
    stage.watch_input = false;
    sb.send(sb.bundle(vec![], vec![stage]));
    sb.wait_for_stdout("x? ", T);
    std::thread::sleep(Duration::from_millis(300));
    sb.send(HostMessage::Stdin(b"1\n".to_vec()));
    let outcome = sb.finish(T);
    assert_eq!(
        transcript(&outcome.messages),
        ["out:x? x=1\n", "end:Some(0)"],
        "{}",
        outcome.diagnostics
    );
}

/// Every ptrace request is refused to a stage, watched or not: among them
/// the ones the container's profile allows the supervisor (TRACEME, CONT,
/// SETOPTIONS) and ATTACH.
#[test]
fn the_stage_cannot_use_ptrace() {
    for watch in [true, false] {
        let mut sb = Sandbox::start();
        let mut stage = watched(
            &sb,
            &[
                "/usr/bin/python3",
                "-c",
                "import ctypes, errno, os\n\
                 libc = ctypes.CDLL(None, use_errno=True)\n\
                 for request in (0, 7, 0x4200, 16):\n\
                 \x20   r = libc.ptrace(request, os.getppid(), None, None)\n\
                 \x20   print(request, r, errno.errorcode[ctypes.get_errno()])",
            ],
        );
        stage.watch_input = watch;
        sb.send(sb.bundle(vec![], vec![stage]));
        let outcome = sb.finish(T);
        assert_eq!(
            outcome.stdout_text(),
            "0 -1 EPERM\n7 -1 EPERM\n16896 -1 EPERM\n16 -1 EPERM\n",
            "watched: {watch}; {}",
            outcome.diagnostics
        );
    }
}

/// A fast conversation: each line is sent the moment its wait is said, so
/// the reader's next read often comes while the stdin thread is finishing
/// the write before (the reader is then held until it is done). Every wait
/// is said exactly once, none is missed.
#[test]
fn every_wait_of_a_fast_conversation_is_said_exactly_once() {
    const LINES: usize = 200;
    let mut sb = Sandbox::start();
    let mut stage = watched(
        &sb,
        &[
            "/usr/bin/python3",
            "-c",
            "for i in range(200):\n    line = input()\n    print('got', line, flush=True)\n",
        ],
    );
    stage.limits.wall_ms = 60_000;
    sb.send(sb.bundle(vec![], vec![stage]));
    for i in 0..LINES {
        wait_for_wanted(&mut sb, T);
        sb.send(HostMessage::Stdin(format!("{i}\n").into_bytes()));
    }
    let outcome = sb.finish(T);
    let wanted = outcome
        .messages
        .iter()
        .filter(|m| **m == SandboxMessage::InputWanted)
        .count();
    assert_eq!(wanted, LINES, "{}", outcome.diagnostics);
    let expected: String = (0..LINES).map(|i| format!("got {i}\n")).collect();
    assert_eq!(outcome.stdout_text(), expected);
    assert_eq!(outcome.only_report().exit_code, Some(0));
}
