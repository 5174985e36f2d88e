//! Escape probes: user code trying to leave the sandbox, reach the network,
//! the supervisor (PID 1) or the host kernel. Each probe runs inside a real
//! sandbox (runc) and prints what it got; the test asserts the exact outcome.

use crate::common;
use crate::common::paths::on_every_start_path;

use code_runner::sandbox::SandboxEngine as _;
use std::collections::HashMap;
use std::time::Duration;

use bollard::query_parameters::InspectContainerOptions;
use code_runner::job::Status;
use code_runner::job::limits::LimitsRequest;
use code_runner::protocol::Reason;
use code_runner::sandbox::{
    EMBEDDED_PROFILE, JobIo, LABEL_CREATED, LABEL_DEADLINE, LABEL_JOB, LABEL_LANGUAGE, LABEL_UID,
    LABEL_WARM, LABEL_WORKER, SandboxClass, SandboxEvent, SandboxShape, container_config,
};
use common::{Harness, job, job_with_limits, python, stdout, stdout_lines};

/// Prints `<what> <errno name>` for each probe, `<what> ok` when it worked.
const PRELUDE: &str = r#"
import errno, os
def outcome(what, action):
    try:
        action()
        print(what, "ok")
    except OSError as e:
        print(what, errno.errorcode.get(e.errno, e.errno))
"#;

fn probe(body: &str) -> code_runner::job::JobSpec {
    python(&format!("{PRELUDE}\n{body}"))
}

/// Runs `spec`, which must succeed, and returns its stdout lines.
async fn run_ok(harness: &Harness, spec: &code_runner::job::JobSpec) -> Vec<String> {
    let result = harness.run(spec).await;
    assert_eq!(result.status, Status::Succeeded, "{result:#?}");
    let run = result.run.as_ref().unwrap();
    assert_eq!(run.reason, Reason::Exited);
    assert_eq!(run.exit_code, Some(0));
    assert_eq!(
        String::from_utf8_lossy(run.stderr.as_bytes()),
        "",
        "the probe wrote to stderr"
    );
    stdout_lines(&result)
}

async fn the_network_is_loopback_only(harness: Harness) {
    // Only 127.0.0.1 and the TEST-NET address 192.0.2.1 are probed; the
    // sandbox has no route anywhere, so nothing leaves it.
    let spec = probe(
        r#"
import socket
def connect(host):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect((host, 80))
    finally:
        s.close()
outcome("127.0.0.1:80", lambda: connect("127.0.0.1"))
outcome("192.0.2.1:80", lambda: connect("192.0.2.1"))
print("interfaces", sorted(os.listdir("/sys/class/net")))
"#,
    );
    // 127.0.0.1 is the container's own loopback (NetworkMode=none keeps `lo`
    // in the container's namespace): nothing listens there, so the kernel
    // refuses at once. There is no other interface and no route, so any other
    // address is unreachable without a packet being sent.
    assert_eq!(
        run_ok(&harness, &spec).await,
        [
            "127.0.0.1:80 ECONNREFUSED",
            "192.0.2.1:80 ENETUNREACH",
            "interfaces ['lo']",
        ]
    );
    harness.assert_clean().await;
}

async fn the_root_filesystem_is_read_only(harness: Harness) {
    let spec = probe(
        r#"
def write(path):
    with open(path, "w") as f:
        f.write("x")
for directory in ["/", "/etc", "/usr", "/usr/bin"]:
    outcome(directory, lambda: write(os.path.join(directory, "escape-probe")))
outcome("/etc/passwd", lambda: open("/etc/passwd", "a").close())
outcome("/workspace", lambda: write("/workspace/ok"))
outcome("/tmp", lambda: write("/tmp/ok"))
"#,
    );
    // Creating a file: EROFS, not EACCES, because the kernel checks the
    // read-only mount (mnt_want_write) before the directory's permission
    // bits. Opening an existing file for writing checks its permission bits
    // first: /etc/passwd is root's 0644, so EACCES. The two tmpfs mounts are
    // the only writable places.
    assert_eq!(
        run_ok(&harness, &spec).await,
        [
            "/ EROFS",
            "/etc EROFS",
            "/usr EROFS",
            "/usr/bin EROFS",
            "/etc/passwd EACCES",
            "/workspace ok",
            "/tmp ok",
        ]
    );
    harness.assert_clean().await;
}

async fn the_workspace_and_tmp_are_size_limited_tmpfs_the_job_can_use(harness: Harness) {
    let spec = job_with_limits(
        "python",
        "main.py",
        r#"
import os, shutil, subprocess
mounts = {}
for line in open("/proc/self/mountinfo"):
    fields = line.split()
    rest = fields[fields.index("-") + 1:]
    mounts[fields[4]] = (rest[0], set(fields[5].split(",")) | set(rest[2].split(",")))
for path in ["/workspace", "/tmp"]:
    fstype, options = mounts[path]
    size = [o for o in options if o.startswith("size=")]
    print(path, fstype, size, "writable" if os.access(path, os.W_OK) else "read-only")
shutil.copy("/bin/true", "/workspace/true")
os.chmod("/workspace/true", 0o755)
print("exec from /workspace", subprocess.run(["/workspace/true"]).returncode)
"#,
        LimitsRequest {
            disk_mb: Some(12),
            ..Default::default()
        },
    );
    // disk_mb = 12: both mounts hold at most 12 MiB (the kernel shows 12288k).
    assert_eq!(
        run_ok(&harness, &spec).await,
        [
            "/workspace tmpfs ['size=12288k'] writable",
            "/tmp tmpfs ['size=12288k'] writable",
            "exec from /workspace 0",
        ]
    );
    harness.assert_clean().await;
}

async fn the_supervisor_cannot_be_reached_through_proc(harness: Harness) {
    let spec = probe(
        r#"
for path in ["/proc/1/fd/1", "/proc/1/mem", "/proc/1/root/etc/hostname", "/proc/1/environ"]:
    outcome(path, lambda: open(path, "rb").close())
outcome("/proc/1/fd/1 for writing", lambda: open("/proc/1/fd/1", "wb").close())
outcome("listdir /proc/1/fd", lambda: os.listdir("/proc/1/fd"))
"#,
    );
    // PID 1 runs as root and the probe as the sandbox's own uid with no capabilities:
    // every one of these is a ptrace-mode access check that fails (EACCES).
    assert_eq!(
        run_ok(&harness, &spec).await,
        [
            "/proc/1/fd/1 EACCES",
            "/proc/1/mem EACCES",
            "/proc/1/root/etc/hostname EACCES",
            "/proc/1/environ EACCES",
            "/proc/1/fd/1 for writing EACCES",
            "listdir /proc/1/fd EACCES",
        ]
    );
    harness.assert_clean().await;
}

async fn the_supervisor_cannot_be_killed_and_the_job_completes(harness: Harness) {
    let spec = probe(
        r#"
import signal
outcome("kill(1, SIGKILL)", lambda: os.kill(1, signal.SIGKILL))
outcome("kill(1, SIGTERM)", lambda: os.kill(1, signal.SIGTERM))
print("still here")
"#,
    );
    let result = harness.run(&spec).await;
    // The job ends normally: the supervisor was not hurt and reports it.
    assert_eq!(result.status, Status::Succeeded, "{result:#?}");
    assert_eq!(result.run.as_ref().unwrap().exit_code, Some(0));
    assert_eq!(
        stdout(&result),
        "kill(1, SIGKILL) EPERM\nkill(1, SIGTERM) EPERM\nstill here\n"
    );
    harness.assert_clean().await;
}

async fn kill_of_every_process_spares_the_supervisor(harness: Harness) {
    // kill(-1, SIGKILL) signals every process the caller may signal except
    // itself (Linux) and PID 1: here the job's own child, never the
    // supervisor, which goes on to report the job.
    let spec = probe(
        r#"
import signal, subprocess
child = subprocess.Popen(["sleep", "1000"])
outcome("kill(-1, SIGKILL)", lambda: os.kill(-1, signal.SIGKILL))
print("child", child.wait())
print("still here")
"#,
    );
    assert_eq!(
        run_ok(&harness, &spec).await,
        ["kill(-1, SIGKILL) ok", "child -9", "still here"]
    );
    harness.assert_clean().await;
}

async fn namespace_ptrace_and_kernel_attack_surface_syscalls_are_denied(harness: Harness) {
    let spec = python(
        r#"
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
def call(name, number, *args):
    ctypes.set_errno(0)
    ret = libc.syscall(number, *args)
    err = ctypes.get_errno()
    print(name, errno.errorcode.get(err, err) if ret == -1 else f"returned {ret}")
call("ptrace(PTRACE_TRACEME)", 101, 0, 0, 0, 0)
call("mount", 165, b"none", b"/tmp", b"tmpfs", 0, None)
call("unshare(CLONE_NEWUSER|CLONE_NEWNS)", 272, 0x10000000 | 0x00020000)
call("setns", 308, -1, 0)
call("keyctl", 250, 0, 0, 0, 0, 0)
call("bpf", 321, 0, None, 0)
call("io_uring_setup", 425, 1, None)
call("userfaultfd", 323, 0)
call("perf_event_open", 298, None, 0, -1, -1, 0)
call("clone3", 435, None, 0)
"#,
    );
    // Each call's arguments would give another errno (EBADF for setns(-1),
    // EFAULT for a NULL pointer) if the call reached the kernel: EPERM is
    // the seccomp profile answering. clone3 gets ENOSYS so libc falls back
    // to clone (see threads_still_work).
    assert_eq!(
        run_ok(&harness, &spec).await,
        [
            "ptrace(PTRACE_TRACEME) EPERM",
            "mount EPERM",
            "unshare(CLONE_NEWUSER|CLONE_NEWNS) EPERM",
            "setns EPERM",
            "keyctl EPERM",
            "bpf EPERM",
            "io_uring_setup EPERM",
            "userfaultfd EPERM",
            "perf_event_open EPERM",
            "clone3 ENOSYS",
        ]
    );
    harness.assert_clean().await;
}

async fn threads_still_work(harness: Harness) {
    let spec = python(
        r#"
import threading
out = []
lock = threading.Lock()
def work(i):
    with lock:
        out.append(i * i)
threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(sorted(out))
"#,
    );
    assert_eq!(run_ok(&harness, &spec).await, ["[0, 1, 4, 9]"]);

    let spec = job(
        "c",
        "main.c",
        r#"
#include <pthread.h>
#include <stdio.h>
#include <string.h>
static long partial[4];
static void *work(void *arg) {
    long i = (long)arg, sum = 0;
    for (long k = i * 1000 + 1; k <= (i + 1) * 1000; k++) sum += k;
    partial[i] = sum;
    return NULL;
}
int main(void) {
    pthread_t threads[4];
    for (long i = 0; i < 4; i++) {
        int error = pthread_create(&threads[i], NULL, work, (void *)i);
        if (error) { printf("pthread_create: %s\n", strerror(error)); return 1; }
    }
    long total = 0;
    for (int i = 0; i < 4; i++) { pthread_join(threads[i], NULL); total += partial[i]; }
    printf("sum 1..4000 = %ld\n", total);
    return 0;
}
"#,
    );
    let result = harness.run(&spec).await;
    assert_eq!(result.status, Status::Succeeded, "{result:#?}");
    assert_eq!(stdout(&result), "sum 1..4000 = 8002000\n");
    harness.assert_clean().await;
}

async fn user_code_is_not_root_and_cannot_become_root(harness: Harness) {
    let spec = probe(
        r#"
print("uid", os.getuid(), os.geteuid(), "gid", os.getgid(), os.getegid(), "groups", os.getgroups())
outcome("setuid(0)", lambda: os.setuid(0))
outcome("setgid(0)", lambda: os.setgid(0))
for line in open("/proc/self/status"):
    key, _, value = line.partition(":")
    if key in ("CapInh", "CapPrm", "CapEff", "CapAmb", "NoNewPrivs", "Seccomp"):
        print(key, value.strip())
"#,
    );
    // The first uid of this engine's range: the sandbox's own, not root's
    // and not nobody's.
    let uid = harness.engine.uids().first();
    assert!(uid >= 100_000, "{uid}");
    let ids = format!("uid {uid} {uid} gid {uid} {uid} groups []");
    assert_eq!(
        run_ok(&harness, &spec).await,
        [
            ids.as_str(),
            "setuid(0) EPERM",
            "setgid(0) EPERM",
            "CapInh 0000000000000000",
            "CapPrm 0000000000000000",
            "CapEff 0000000000000000",
            "CapAmb 0000000000000000",
            "NoNewPrivs 1",
            // 2 = SECCOMP_MODE_FILTER: the profile is applied.
            "Seccomp 2",
        ]
    );
    harness.assert_clean().await;
}

async fn a_symlink_to_the_supervisors_root_leads_nowhere(harness: Harness) {
    let spec = probe(
        r#"
os.symlink("/proc/1/root", "/workspace/root")
outcome("read through the symlink", lambda: open("/workspace/root/etc/hostname").read())
outcome("list through the symlink", lambda: os.listdir("/workspace/root/"))
os.symlink("/proc/1/fd/1", "/workspace/out")
outcome("write through a symlink to /proc/1/fd/1", lambda: open("/workspace/out", "w").write("x"))
"#,
    );
    // The symlink is followed, and the same ptrace-mode check on /proc/1 as
    // without it refuses.
    assert_eq!(
        run_ok(&harness, &spec).await,
        [
            "read through the symlink EACCES",
            "list through the symlink EACCES",
            "write through a symlink to /proc/1/fd/1 EACCES",
        ]
    );
    harness.assert_clean().await;
}

/// Limits that differ from every default, so a default cannot pass for them.
fn unusual_limits() -> LimitsRequest {
    LimitsRequest {
        memory_mb: Some(96),
        pids: Some(40),
        disk_mb: Some(12),
        wall_ms: Some(60_000),
        ..Default::default()
    }
}

#[tokio::test]
async fn the_container_config_is_hardened() {
    let harness = Harness::new().await;
    let job = harness.prepare(&job_with_limits(
        "python",
        "main.py",
        "print(1)",
        unusual_limits(),
    ));
    let shape = SandboxShape {
        image: job.language.image_ref(),
        language: job.language.id.clone(),
        class: SandboxClass::of(&job.limits),
        uid: 100_123,
        job_id: Some("job-1".to_string()),
        created_ms: 1_000,
        deadline_ms: 2_000,
        checker: false,
        egress_dir: None,
    };
    let body = container_config(&shape, harness.engine.config());
    let host = body.host_config.clone().expect("a host config");

    assert_eq!(body.image.as_deref(), Some("code-runner/python:latest"));
    assert_eq!(body.network_disabled, Some(true));
    assert_eq!(body.env, Some(vec![]), "the supervisor's env holds nothing");
    assert_eq!(body.user, None, "the supervisor starts as the image's root");
    assert_eq!(host.network_mode.as_deref(), Some("none"));
    assert_eq!(host.readonly_rootfs, Some(true));
    assert_eq!(host.cap_drop, Some(vec!["ALL".to_string()]));
    assert_eq!(
        host.cap_add,
        Some(vec!["SETUID".to_string(), "SETGID".to_string()])
    );
    assert_eq!(host.privileged, None);
    let security_opt = host.security_opt.clone().unwrap_or_default();
    assert_eq!(security_opt.len(), 2, "{security_opt:?}");
    assert!(security_opt.contains(&"no-new-privileges".to_string()));
    let seccomp = security_opt
        .iter()
        .find(|o| o.starts_with("seccomp="))
        .expect("a seccomp profile");
    assert_eq!(seccomp, &format!("seccomp={EMBEDDED_PROFILE}"));
    assert_eq!(host.memory, Some(96 * 1024 * 1024));
    assert_eq!(host.memory_swap, Some(96 * 1024 * 1024));
    assert_eq!(host.pids_limit, Some(40));
    assert_eq!(host.nano_cpus, Some(1_000_000_000));
    let tmpfs = host.tmpfs.clone().unwrap_or_default();
    let mut mounts: Vec<&str> = tmpfs.keys().map(String::as_str).collect();
    mounts.sort();
    assert_eq!(mounts, ["/tmp", "/workspace"]);
    for (mount, options) in &tmpfs {
        let options: Vec<&str> = options.split(',').collect();
        for wanted in [
            "rw",
            "nosuid",
            "nodev",
            "size=12m",
            "uid=100123",
            "gid=100123",
        ] {
            assert!(
                options.contains(&wanted),
                "{mount}: {options:?} lacks {wanted}"
            );
        }
    }
    // Docker mounts a HostConfig.Tmpfs entry noexec unless told `exec`, and
    // compiled programs run from the workspace (`./main`).
    let workspace: Vec<&str> = tmpfs["/workspace"].split(',').collect();
    assert!(
        workspace.contains(&"exec"),
        "/workspace must be mounted exec: {workspace:?}"
    );
    let ulimits: Vec<(String, i64, i64)> = host
        .ulimits
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|u| (u.name.unwrap(), u.soft.unwrap(), u.hard.unwrap()))
        .collect();
    assert_eq!(
        ulimits,
        [
            ("nofile".to_string(), 1024, 1024),
            ("fsize".to_string(), 12 << 20, 12 << 20),
            ("core".to_string(), 0, 0),
        ]
    );
    assert_eq!(host.runtime, None, "runc is Docker's default");
    assert_eq!(
        body.labels,
        Some(HashMap::from([
            (LABEL_JOB.to_string(), "job-1".to_string()),
            (LABEL_WORKER.to_string(), harness.worker_id.clone()),
            (LABEL_CREATED.to_string(), "1000".to_string()),
            (LABEL_DEADLINE.to_string(), "2000".to_string()),
            (LABEL_LANGUAGE.to_string(), "python".to_string()),
            (LABEL_UID.to_string(), "100123".to_string()),
        ]))
    );
    // A warm sandbox has no job yet: the warm label instead.
    let warm = container_config(
        &SandboxShape {
            job_id: None,
            ..shape
        },
        harness.engine.config(),
    );
    let labels = warm.labels.expect("labels");
    assert_eq!(labels.get(LABEL_WARM).map(String::as_str), Some("1"));
    assert!(!labels.contains_key(LABEL_JOB));
    harness.assert_clean().await;
}

#[tokio::test]
async fn docker_applies_the_hardened_config_to_a_running_sandbox() {
    let harness = Harness::new().await;
    let job = harness.prepare(&job_with_limits(
        "bash",
        "main.sh",
        "echo running; sleep 1000",
        unusual_limits(),
    ));
    let job_id = uuid::Uuid::new_v4().to_string();
    let (events_tx, mut events) = tokio::sync::mpsc::channel(16);
    let io = JobIo {
        events: Some(events_tx),
        ..Default::default()
    };
    let cancel = io.cancel.clone();
    let engine = harness.engine.clone();
    let id = job_id.clone();
    let unix_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("the clock is past 1970")
            .as_millis() as u64
    };
    let before_ms = unix_ms();
    let running = tokio::spawn(async move { engine.run(&id, &job, io).await });

    // Inspect once the program runs: the container is then surely started.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match common::next_event(&mut events, deadline).await {
            Some(SandboxEvent::Stdout(_)) => break,
            Some(_) => {}
            None => panic!("the job ended before it printed"),
        }
    }
    let printed_ms = unix_ms();
    let containers = harness.leftovers().await;
    assert_eq!(containers.len(), 1);
    let inspect = harness
        .engine
        .docker()
        .inspect_container(&containers[0], None::<InspectContainerOptions>)
        .await
        .expect("the sandbox container exists");
    cancel.cancel();
    let result = running.await.unwrap();
    assert_eq!(result.status, Status::Cancelled, "{result:#?}");

    let host = inspect.host_config.expect("a host config");
    assert_eq!(host.network_mode.as_deref(), Some("none"));
    assert_eq!(host.readonly_rootfs, Some(true));
    assert_eq!(host.cap_drop, Some(vec!["ALL".to_string()]));
    assert_eq!(
        host.cap_add,
        Some(vec!["SETUID".to_string(), "SETGID".to_string()])
    );
    assert_eq!(host.privileged, Some(false));
    let security_opt = host.security_opt.unwrap_or_default();
    assert!(
        security_opt.contains(&"no-new-privileges".to_string()),
        "{security_opt:?}"
    );
    assert!(
        security_opt.iter().any(|o| o.starts_with("seccomp=")),
        "no seccomp profile in {security_opt:?}"
    );
    assert_eq!(host.memory, Some(96 * 1024 * 1024));
    assert_eq!(host.memory_swap, Some(96 * 1024 * 1024));
    assert_eq!(host.pids_limit, Some(40));
    let tmpfs = host.tmpfs.unwrap_or_default();
    let mut mounts: Vec<&str> = tmpfs.keys().map(String::as_str).collect();
    mounts.sort();
    assert_eq!(mounts, ["/tmp", "/workspace"]);
    assert!(
        tmpfs
            .values()
            .all(|o| o.split(',').any(|p| p == "size=12m")),
        "{tmpfs:?}"
    );
    let labels = inspect
        .config
        .and_then(|c| c.labels)
        .expect("the container has labels");
    assert_eq!(labels.get(LABEL_JOB), Some(&job_id));
    assert_eq!(labels.get(LABEL_WORKER), Some(&harness.worker_id));
    for label in [LABEL_CREATED, LABEL_DEADLINE] {
        let value: u64 = labels
            .get(label)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("label {label} is not a unix time in ms: {labels:?}"));
        assert!(value > 1_600_000_000_000, "{label} = {value}");
    }
    let created: u64 = labels[LABEL_CREATED].parse().unwrap();
    let deadline: u64 = labels[LABEL_DEADLINE].parse().unwrap();
    // Both are read from the clock while the run starts (the deadline first,
    // then the container's creation): the deadline is the start timeout
    // (30 s) + the stage's wall limit (60 s) + grace (3 s) from then.
    assert!(
        (before_ms..=printed_ms).contains(&created),
        "created {created} not in {before_ms}..={printed_ms}"
    );
    assert!(
        (before_ms + 93_000..=created + 93_000).contains(&deadline),
        "deadline {deadline} is not 93 s from the run's start ({before_ms}..={created})"
    );
    harness.assert_clean().await;
}

// Each probe above, once per start path: a warm sandbox must be as closed
// as a cold one.
on_every_start_path!(
    the_network_is_loopback_only,
    the_root_filesystem_is_read_only,
    the_workspace_and_tmp_are_size_limited_tmpfs_the_job_can_use,
    the_supervisor_cannot_be_reached_through_proc,
    the_supervisor_cannot_be_killed_and_the_job_completes,
    kill_of_every_process_spares_the_supervisor,
    namespace_ptrace_and_kernel_attack_surface_syscalls_are_denied,
    threads_still_work,
    user_code_is_not_root_and_cannot_become_root,
    a_symlink_to_the_supervisors_root_leads_nowhere,
);
