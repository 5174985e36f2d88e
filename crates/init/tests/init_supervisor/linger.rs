//! After `done`, a bundle with `linger_ms` keeps the supervisor, idle, until
//! the host closes its stream: nothing of the job may run meanwhile.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use code_runner_protocol::{HostMessage, SandboxMessage};

use super::T;
use super::harness::{Sandbox, live_processes_of};

/// `message`, a bundle, asking the supervisor to linger `linger_ms` after
/// emptying `wipe`.
fn lingering(message: HostMessage, linger_ms: u64, wipe: Vec<String>) -> HostMessage {
    let HostMessage::Bundle(mut bundle) = message else {
        panic!("not a bundle: {message:?}");
    };
    bundle.linger_ms = linger_ms;
    bundle.linger_wipe = wipe;
    HostMessage::Bundle(bundle)
}

/// A directory any uid may write in, as the workspace is.
fn scratch_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    dir
}

fn names_in(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Reads frames until `done`.
fn until_done(sb: &mut Sandbox) {
    while !matches!(sb.next(T), SandboxMessage::Done) {}
}

/// Runs `echo hi` with `linger_ms` and `wipe`, until `done`.
fn echo_until_done(sb: &mut Sandbox, linger_ms: u64, wipe: Vec<String>) {
    let stage = sb.stage("run", &["/bin/sh", "-c", "echo hi"]);
    sb.send(lingering(sb.bundle(vec![], vec![stage]), linger_ms, wipe));
    until_done(sb);
}

/// A job that leaves a process behind (in the background, its own session,
/// ignoring SIGHUP and SIGTERM) and a sleeping child.
fn leaves_processes(sb: &Sandbox) -> HostMessage {
    let stage = sb.stage(
        "run",
        &[
            "/bin/sh",
            "-c",
            "setsid sh -c 'trap \"\" HUP TERM; while :; do :; done' & sleep 1000 & echo started",
        ],
    );
    sb.bundle(vec![], vec![stage])
}

#[test]
fn a_lingering_supervisor_stays_until_the_host_closes_its_stream_with_no_process_of_the_job_left() {
    let mut sb = Sandbox::start();
    sb.send(lingering(leaves_processes(&sb), 60_000, Vec::new()));
    until_done(&mut sb);
    // Well past `done` the supervisor is still there, alone.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(sb.child.try_wait().unwrap(), None, "the supervisor exited");
    assert_eq!(live_processes_of(sb.uid), Vec::<u32>::new());
    // Late frames are dropped, not an error.
    sb.send(HostMessage::Stdin(b"late\n".to_vec()));
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(sb.child.try_wait().unwrap(), None, "a late frame ended it");
    let closed = Instant::now();
    sb.close_stdin();
    let outcome = sb.finish(T);
    assert!(
        closed.elapsed() < Duration::from_secs(5),
        "{:?}",
        closed.elapsed()
    );
    assert_eq!(outcome.exit_code, Some(0));
    assert_eq!(outcome.stdout, b"started\n");
    assert_eq!(outcome.diagnostics, "");
    assert!(matches!(
        outcome.messages.last(),
        Some(SandboxMessage::Done)
    ));
}

#[test]
fn a_lingering_supervisor_exits_by_itself_after_linger_ms() {
    let mut sb = Sandbox::start();
    echo_until_done(&mut sb, 1_000, Vec::new());
    let done = Instant::now();
    // The host never closes its stream.
    let outcome = sb.finish(T);
    let lingered = done.elapsed();
    assert!(lingered >= Duration::from_millis(900), "{lingered:?}");
    assert!(lingered < Duration::from_secs(10), "{lingered:?}");
    assert_eq!(outcome.exit_code, Some(0));
    assert!(sb.stdin.is_some());
}

#[test]
fn sigterm_ends_a_lingering_supervisor() {
    let mut sb = Sandbox::start();
    echo_until_done(&mut sb, 60_000, Vec::new());
    sb.signal_supervisor(nix::sys::signal::Signal::SIGTERM);
    let outcome = sb.finish(Duration::from_secs(5));
    assert_eq!(outcome.exit_code, Some(0));
}

#[test]
fn without_linger_the_supervisor_exits_after_done_with_its_stream_open() {
    let mut sb = Sandbox::start();
    echo_until_done(&mut sb, 0, Vec::new());
    let outcome = sb.finish(Duration::from_secs(5));
    assert_eq!(outcome.exit_code, Some(0));
    assert!(sb.stdin.is_some());
}

#[test]
fn a_lingering_supervisor_first_empties_the_directories_it_was_given() {
    let mut sb = Sandbox::start();
    let other = scratch_dir();
    let other_path = other.path().to_string_lossy().into_owned();
    // Files, a nested tree the job locked itself out of, a symbolic link
    // out of the directory, in the workspace and in another directory.
    let script = format!(
        "head -c 1000000 /dev/zero > big; mkdir -p deep/er; echo x > deep/er/f; \
         chmod 000 deep/er deep; ln -s /etc/passwd link; \
         echo y > {other_path}/file; mkdir {other_path}/d; echo written"
    );
    let stage = sb.stage("run", &["/bin/sh", "-c", &script]);
    let wipe = vec![
        sb.workspace().to_string_lossy().into_owned(),
        other_path.clone(),
        "/nonexistent/is/skipped".to_string(),
    ];
    sb.send(lingering(sb.bundle(vec![], vec![stage]), 60_000, wipe));
    until_done(&mut sb);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(sb.child.try_wait().unwrap(), None, "the supervisor exited");
    assert_eq!(names_in(sb.workspace()), Vec::<String>::new());
    assert_eq!(names_in(other.path()), Vec::<String>::new());
    assert!(std::path::Path::new("/etc/passwd").exists());
    sb.close_stdin();
    let outcome = sb.finish(T);
    assert_eq!(outcome.exit_code, Some(0));
    assert_eq!(outcome.stdout, b"written\n");
    assert_eq!(outcome.diagnostics, "");
}

#[test]
fn a_supervisor_that_cannot_empty_a_directory_does_not_linger() {
    let mut sb = Sandbox::start();
    // An entry the job's uid cannot remove: root's own directory, not empty.
    let blocked = sb.workspace().join("roots");
    std::fs::create_dir(&blocked).unwrap();
    std::fs::write(blocked.join("file"), b"root's").unwrap();
    let wipe = vec![sb.workspace().to_string_lossy().into_owned()];
    echo_until_done(&mut sb, 60_000, wipe);
    // It exits at once, its stream still open, and says why.
    let outcome = sb.finish(Duration::from_secs(5));
    assert_eq!(outcome.exit_code, Some(0));
    assert!(sb.stdin.is_some());
    assert!(
        outcome
            .diagnostics
            .contains("not lingering after done: cannot open up")
            && outcome.diagnostics.contains("roots"),
        "{}",
        outcome.diagnostics
    );
}
