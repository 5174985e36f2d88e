//! A watched stage (traced, see crates/init/src/watch.rs) reads a big
//! input exactly as an unwatched one does, whether it reads one byte at a
//! time (a shell's `read`), 64 KiB at a time (`cat`) or by lines (Python).
//! Each pair prints both times: what watching costs, since every read of
//! stdin stops the reader once. `CODE_RUNNER_INPUT_COST_SCALE=10` reads ten
//! times as much (docs/performance.md quotes that run).

use std::time::{Duration, Instant};

use code_runner_protocol::HostMessage;

use super::harness::Sandbox;

fn scale() -> usize {
    std::env::var("CODE_RUNNER_INPUT_COST_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// Runs `script` with `lines` lines of stdin, all sent at once; its stdout
/// and how long it took.
fn read_all(watch: bool, script: &str, lines: usize) -> (String, Duration) {
    let mut sb = Sandbox::start();
    let mut stage = sb.stage("run", &["sh", "-c", script]);
    stage.stdin = true;
    stage.watch_input = watch;
    stage.limits.wall_ms = 300_000;
    stage.limits.cpu_ms = 300_000;
    let input: String = (0..lines).map(|i| format!("line {i}\n")).collect();
    sb.send(sb.bundle(vec![], vec![stage]));
    let started = Instant::now();
    sb.send(HostMessage::Stdin(input.into_bytes()));
    sb.send(HostMessage::StdinClose);
    let outcome = sb.finish(Duration::from_secs(320));
    let took = started.elapsed();
    assert_eq!(
        outcome.only_report().exit_code,
        Some(0),
        "{}",
        outcome.diagnostics
    );
    (outcome.stdout_text(), took)
}

fn same_with_and_without_watching(name: &str, script: &str, lines: usize) {
    let lines = lines * scale();
    let (plain, plain_took) = read_all(false, script, lines);
    let (watched, watched_took) = read_all(true, script, lines);
    assert_eq!(plain, format!("{lines}\n"));
    assert_eq!(watched, plain);
    eprintln!("{name}, {lines} lines: unwatched {plain_took:?}, watched {watched_took:?}");
}

#[test]
fn a_shell_reading_one_byte_at_a_time() {
    same_with_and_without_watching(
        "sh read",
        "n=0; while read l; do n=$((n+1)); done; echo $n",
        2000,
    );
}

#[test]
fn cat_reading_whole_pipes() {
    same_with_and_without_watching("cat", "cat | wc -l", 20_000);
}

#[test]
fn python_reading_lines() {
    same_with_and_without_watching(
        "python3",
        "/usr/bin/python3 -c 'import sys\nprint(sum(1 for _ in sys.stdin))'",
        20_000,
    );
}
