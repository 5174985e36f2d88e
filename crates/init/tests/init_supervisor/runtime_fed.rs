//! Fed warm runtimes (like ruby's, and R's hookless one): the runtime
//! reads its script through a FIFO the supervisor made and feeds with the
//! job's file on release; the supervisor holds the FIFO's ends only as
//! long as it must.

use std::time::Duration;

use code_runner_protocol::{HostMessage, SandboxMessage, StageSpec};

use super::harness::{Sandbox, file, live_processes_of};
use super::runtime::{
    T, fitting_stage, listing, made_entry, prestart, released, said_warm_runtime,
};
use super::threads::tasks_of;

/// Like ruby: opens `main.rb` at its start (a FIFO), reads one byte (the
/// lead, printed in hex) and the file's type, waits for its args, then
/// prints what it reads from that descriptor and what `main.rb` is now.
const FED: &str = "exec 3<main.rb; lead=$(dd bs=1 count=1 <&3 2>/dev/null | od -An -tx1); \
     kind=$(stat -L -c %F /proc/self/fd/3); args=$(tr '\\0' '|' <&200); exec 200<&-; \
     echo \"runtime got: $args lead$lead from a $kind\"; cat <&3; stat -c '%F %s' main.rb";

fn fed(sb: &Sandbox, stage: &StageSpec, runtime: &str) -> HostMessage {
    let HostMessage::Prestart(mut prestart) = prestart(sb, stage) else {
        unreachable!()
    };
    prestart.argv = vec!["/bin/bash".into(), "-c".into(), runtime.into()];
    prestart.fed = Some("main.rb".into());
    HostMessage::Prestart(prestart)
}

#[test]
fn a_fed_runtime_reads_the_jobs_file_through_its_fifo() {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
    let mut sb = Sandbox::start();
    let stage = fitting_stage(&sb, &["x"]);
    sb.send(fed(&sb, &stage, FED));
    // Before the job: a FIFO, as the runtime's uid.
    let made = made_entry(&sb);
    assert!(made.file_type().is_fifo(), "{made:?}");
    assert_eq!(made.uid(), sb.uid);
    // Let the runtime open it and take its lead byte.
    std::thread::sleep(Duration::from_millis(300));
    let files = vec![
        file("lib.rb", b"", false),
        file("main.rb", b"puts :job\n", true),
    ];
    assert_eq!(
        released(&mut sb, files, stage),
        "runtime got: x| lead ef from a fifo\nputs :job\nregular file 10\n"
    );
    // The job's file replaced the FIFO, whole, with its mode; nothing else
    // is left of the hand-over.
    let written = std::fs::symlink_metadata(sb.workspace().join("main.rb")).unwrap();
    assert!(written.file_type().is_file());
    assert_eq!(written.uid(), sb.uid);
    assert_eq!(written.permissions().mode() & 0o777, 0o755);
    assert_eq!(listing(&sb), ["lib.rb", "main.rb"]);
}

#[test]
fn a_fed_runtime_takes_a_script_larger_than_its_fifo_holds() {
    let mut sb = Sandbox::start();
    let stage = fitting_stage(&sb, &[]);
    let runtime = "exec 3<main.rb; dd bs=1 count=1 <&3 2>/dev/null >/dev/null; \
                   tr -d '\\0' <&200 >/dev/null; exec 200<&-; cat <&3 | sha256sum";
    sb.send(fed(&sb, &stage, runtime));
    made_entry(&sb);
    // 200 KiB: more than a FIFO takes without a reader (64 KiB).
    let content: Vec<u8> = (0..200 * 1024).map(|i| b'a' + (i % 26) as u8).collect();
    let bundle = sb.bundle(vec![file("main.rb", &content, false)], vec![stage]);
    sb.send(bundle);
    let outcome = sb.finish(T);
    assert_eq!(said_warm_runtime(&outcome.messages), [true]);
    assert_eq!(outcome.only_report().exit_code, Some(0), "{outcome:?}");
    let digest = std::process::Command::new("sha256sum")
        .stdin(std::fs::File::open(sb.workspace().join("main.rb")).unwrap())
        .output()
        .unwrap();
    assert_eq!(
        outcome.stdout_text(),
        String::from_utf8(digest.stdout).unwrap()
    );
}

/// The access modes ("r", "w", "rw") of the supervisor's descriptors open
/// on the FIFO `main.rb`, sorted.
fn supervisor_ends_of_the_fifo(sb: &Sandbox) -> Vec<&'static str> {
    use std::os::unix::fs::MetadataExt;
    let fifo = std::fs::symlink_metadata(sb.workspace().join("main.rb")).unwrap();
    let pid = sb.child.id();
    let mut ends = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap() {
        let entry = entry.unwrap();
        let Ok(open) = std::fs::metadata(entry.path()) else {
            continue; // closed meanwhile
        };
        if (open.dev(), open.ino()) != (fifo.dev(), fifo.ino()) {
            continue;
        }
        let fd = entry.file_name().into_string().unwrap();
        let Ok(info) = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")) else {
            continue; // closed between the two looks
        };
        let flags = info
            .lines()
            .find_map(|line| line.strip_prefix("flags:"))
            .unwrap();
        ends.push(match u32::from_str_radix(flags.trim(), 8).unwrap() & 3 {
            0 => "r",
            1 => "w",
            _ => "rw",
        });
    }
    ends.sort_unstable();
    ends
}

#[test]
fn once_a_fed_runtime_holds_its_fifo_the_supervisor_keeps_only_its_write_end() {
    let mut sb = Sandbox::start();
    let stage = fitting_stage(&sb, &["y"]);
    // Opens its script a second after its start, long before its job.
    let slow = format!("sleep 1; {FED}");
    sb.send(fed(&sb, &stage, &slow));
    made_entry(&sb);
    // Until the runtime opens it, the FIFO's reader is the supervisor's.
    assert_eq!(supervisor_ends_of_the_fifo(&sb), ["r", "w"]);
    // Seen while the sandbox waits for its job: the read end goes.
    let until = std::time::Instant::now() + T;
    while supervisor_ends_of_the_fifo(&sb) != ["w"] {
        assert!(std::time::Instant::now() < until, "the read end stayed");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        released(&mut sb, vec![file("main.rb", b"seen\n", false)], stage),
        "runtime got: y| lead ef from a fifo\nseen\nregular file 5\n"
    );
}

#[test]
fn a_fed_runtime_that_ends_with_its_script_unread_leaves_no_thread_writing_it() {
    let mut sb = Sandbox::start();
    let stage = fitting_stage(&sb, &[]);
    // Takes its lead byte and its release, and ends without its script.
    let quitter = "exec 3<main.rb; dd bs=1 count=1 <&3 2>/dev/null >/dev/null; \
                   tr -d '\\0' <&200 >/dev/null; exit 3";
    sb.send(fed(&sb, &stage, quitter));
    made_entry(&sb);
    // 200 KiB: the release writes what the FIFO does not take at once
    // from a thread of its own.
    let content = vec![b'#'; 200 * 1024];
    let HostMessage::Bundle(mut bundle) =
        sb.bundle(vec![file("main.rb", &content, false)], vec![stage])
    else {
        unreachable!()
    };
    // The supervisor stays after `done`, to be looked at.
    bundle.linger_ms = 60_000;
    sb.send(HostMessage::Bundle(bundle));
    let report = loop {
        match sb.next(T) {
            SandboxMessage::StageEnd(report) => break report,
            SandboxMessage::Done => panic!("done before the stage's end"),
            _ => {}
        }
    };
    assert_eq!(report.exit_code, Some(3), "{report:?}");
    assert_eq!(said_warm_runtime(&sb.seen), [true]);
    // The writing thread ends: its writes fail once the runtime is gone.
    let pid = sb.child.id();
    let until = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let writers: Vec<_> = tasks_of(pid)
            .into_iter()
            .filter(|task| task.name == "runtime-args")
            .collect();
        if writers.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "still writing the script: {writers:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn content_a_fed_runtime_cannot_take_starts_cold_and_its_fifo_is_gone() {
    use std::os::unix::fs::FileTypeExt;
    let mut sb = Sandbox::start();
    let fitting = fitting_stage(&sb, &[]);
    sb.send(fed(&sb, &fitting, FED));
    assert!(made_entry(&sb).file_type().is_fifo());
    // A `#!` line: the fed runtime already read another first byte.
    let mut cold = fitting;
    cold.argv = vec!["/bin/sh".into(), "-c".into(), "cat main.rb".into()];
    let bundle = sb.bundle(
        vec![file("main.rb", b"#!ruby -w\nfresh\n", false)],
        vec![cold],
    );
    sb.send(bundle);
    let outcome = sb.finish(T);
    assert_eq!(said_warm_runtime(&outcome.messages), [false]);
    assert_eq!(outcome.only_report().exit_code, Some(0), "{outcome:?}");
    assert_eq!(outcome.stdout_text(), "#!ruby -w\nfresh\n");
    let entry = std::fs::symlink_metadata(sb.workspace().join("main.rb")).unwrap();
    assert!(!entry.file_type().is_fifo() && entry.file_type().is_file());
    assert_eq!(listing(&sb), ["main.rb"]);
    assert!(live_processes_of(sb.uid).is_empty());
}

/// Like R: opens `main.rb` at its start (a FIFO with no lead byte), has no
/// control descriptor, and waits for its program by reading the FIFO; then
/// prints it, what it read it from, its file-size limit (the stage's, set before the release)
/// and what `main.rb` is now.
const HOOKLESS: &str = "exec 3<main.rb; kind=$(stat -L -c %F /proc/self/fd/3); script=$(cat <&3); \
     echo \"runtime got: $script from a $kind\"; \
     test -e /proc/self/fd/200 && echo control-open || echo control-closed; ulimit -f; \
     stat -c '%F %s' main.rb";

fn hookless(sb: &Sandbox, stage: &StageSpec, runtime: &str) -> HostMessage {
    let HostMessage::Prestart(mut prestart) = fed(sb, stage, runtime) else {
        unreachable!()
    };
    prestart.hookless = true;
    HostMessage::Prestart(prestart)
}

#[test]
fn a_hookless_runtime_reads_the_jobs_file_from_its_first_byte() {
    let mut sb = Sandbox::start();
    let mut stage = fitting_stage(&sb, &[]);
    stage.limits.fsize_bytes = 512 * 1024;
    sb.send(hookless(&sb, &stage, HOOKLESS));
    made_entry(&sb);
    let files = vec![file("main.rb", b"#!first\nsecond", false)];
    assert_eq!(
        released(&mut sb, files, stage),
        "runtime got: #!first\nsecond from a fifo\ncontrol-closed\n512\nregular file 14\n"
    );
    assert_eq!(listing(&sb), ["main.rb"]);
}

/// Makes the prestart of a fed runtime of one kind: [`fed`] or [`hookless`].
type FedKind = fn(&Sandbox, &StageSpec, &str) -> HostMessage;

/// Each kind of fed runtime, with its test runtime, a script for it and
/// what it prints when released with that script.
const FED_KINDS: [(&str, FedKind, &str, &[u8], &str); 2] = [
    (
        "hooked",
        fed,
        FED,
        b"late\n",
        "runtime got:  lead ef from a fifo\nlate\nregular file 5\n",
    ),
    (
        "hookless",
        hookless,
        HOOKLESS,
        b"late",
        "runtime got: late from a fifo\ncontrol-closed\n1024\nregular file 4\n",
    ),
];

#[test]
fn a_job_waits_for_a_fed_runtime_still_starting_to_open_its_fifo() {
    for (kind, prestart, runtime, script, printed) in FED_KINDS {
        let mut sb = Sandbox::start();
        let stage = fitting_stage(&sb, &[]);
        // The bundle comes at once, before the runtime opens its script:
        // the job waits for it rather than have a hooked runtime read the
        // job's file by its name (leaving the FIFO's copy unread), or a
        // hookless one open it and run it unreleased. It waits longer than
        // a loaded VM's R under gVisor may take (more than 2 s).
        let slow = format!("sleep 3; {runtime}");
        sb.send(prestart(&sb, &stage, &slow));
        assert_eq!(
            released(&mut sb, vec![file("main.rb", script, false)], stage),
            printed,
            "{kind}"
        );
    }
}

#[test]
fn a_fed_runtime_that_does_not_open_its_fifo_in_time_is_not_used() {
    for (kind, prestart, runtime, _, _) in FED_KINDS {
        let mut sb = Sandbox::start();
        let stage = fitting_stage(&sb, &[]);
        let stuck = format!("sleep 30; {runtime}");
        sb.send(prestart(&sb, &stage, &stuck));
        made_entry(&sb);
        let bundle = sb.bundle(vec![file("main.rb", b"never", false)], vec![stage]);
        sb.send(bundle);
        let outcome = sb.finish(T);
        assert_eq!(said_warm_runtime(&outcome.messages), [false], "{kind}");
        // Started cold: the command does not exist.
        assert_eq!(
            outcome.only_report().exit_code,
            Some(127),
            "{kind}: {outcome:?}"
        );
        assert_eq!(outcome.stdout_text(), "", "{kind}");
        assert!(
            outcome.diagnostics.contains("had not opened its script"),
            "{kind}: {outcome:?}"
        );
        assert!(live_processes_of(sb.uid).is_empty(), "{kind}");
    }
}

#[test]
fn a_hookless_runtime_takes_no_args() {
    let mut sb = Sandbox::start();
    let fitting = fitting_stage(&sb, &[]);
    sb.send(hookless(&sb, &fitting, HOOKLESS));
    made_entry(&sb);
    let with_args = fitting_stage(&sb, &["x"]);
    let bundle = sb.bundle(vec![file("main.rb", b"p 1", false)], vec![with_args]);
    sb.send(bundle);
    let outcome = sb.finish(T);
    assert_eq!(said_warm_runtime(&outcome.messages), [false]);
    assert_eq!(outcome.only_report().exit_code, Some(127), "{outcome:?}");
    assert_eq!(outcome.stdout_text(), "");
    assert!(live_processes_of(sb.uid).is_empty());
}
