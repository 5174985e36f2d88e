//! The kernel doors the seccomp profile closes, probed from inside real
//! sandboxes: `socket()` only for AF_UNIX, AF_INET and AF_INET6, no 32-bit
//! x86 or x32 system calls, no `modify_ldt` (runc; and what gVisor's own
//! kernel answers under runsc, where no seccomp profile applies), and the
//! loader refusing an operator profile that re-opens one of them unless
//! `CODE_RUNNER_SECCOMP_ALLOW` names it.

use crate::common;

use std::process::{Command, Stdio};

use code_runner::job::{JobSpec, Status};
use code_runner::protocol::Reason;
use code_runner::sandbox::EMBEDDED_PROFILE;
use common::{CliHarness, Harness, harness_per_runtime, job, python, stdout_lines};

/// Runs `spec`, which must succeed, and returns its stdout lines.
async fn run_ok(runtime: &str, harness: &Harness, spec: &JobSpec) -> Vec<String> {
    let result = harness.run(spec).await;
    assert_eq!(result.status, Status::Succeeded, "{runtime}: {result:#?}");
    assert_eq!(result.run.as_ref().map(|r| r.reason), Some(Reason::Exited));
    stdout_lines(&result)
}

const SOCKET_PROBE: &str = r#"
import errno, socket
def probe(what, make):
    try:
        made = make()
        for s in made if isinstance(made, tuple) else (made,):
            s.close()
        print(what, "ok")
    except OSError as e:
        print(what, errno.errorcode.get(e.errno, e.errno))
for name, family, kind in [
    ("AF_UNIX", 1, socket.SOCK_STREAM),
    ("AF_INET", 2, socket.SOCK_STREAM),
    ("AF_INET6", 10, socket.SOCK_DGRAM),
    ("AF_NETLINK", 16, socket.SOCK_RAW),
    ("AF_PACKET", 17, socket.SOCK_RAW),
    ("AF_KEY", 15, socket.SOCK_RAW),
    ("AF_ALG", 38, socket.SOCK_SEQPACKET),
    ("AF_VSOCK", 40, socket.SOCK_STREAM),
    ("AF_APPLETALK", 5, socket.SOCK_DGRAM),
]:
    probe(f"socket({name})", lambda: socket.socket(family, kind, 0))
probe("socketpair(AF_UNIX)", lambda: socket.socketpair(1, socket.SOCK_STREAM))
probe("socketpair(AF_INET)", lambda: socket.socketpair(2, socket.SOCK_STREAM))
probe("socketpair(AF_NETLINK)", lambda: socket.socketpair(16, socket.SOCK_RAW))
"#;

#[tokio::test]
async fn sockets_only_of_the_unix_and_internet_families() {
    for (runtime, harness) in
        harness_per_runtime("sockets_only_of_the_unix_and_internet_families").await
    {
        let lines = run_ok(runtime, &harness, &python(SOCKET_PROBE)).await;
        let expected: &[&str] = if runtime == "runc" {
            // The profile answers EAFNOSUPPORT, as a kernel without the
            // family would: the family's own code is never reached.
            &[
                "socket(AF_UNIX) ok",
                "socket(AF_INET) ok",
                "socket(AF_INET6) ok",
                "socket(AF_NETLINK) EAFNOSUPPORT",
                "socket(AF_PACKET) EAFNOSUPPORT",
                "socket(AF_KEY) EAFNOSUPPORT",
                "socket(AF_ALG) EAFNOSUPPORT",
                "socket(AF_VSOCK) EAFNOSUPPORT",
                "socket(AF_APPLETALK) EAFNOSUPPORT",
                "socketpair(AF_UNIX) ok",
                "socketpair(AF_INET) EAFNOSUPPORT",
                "socketpair(AF_NETLINK) EAFNOSUPPORT",
            ]
        } else {
            // gVisor's own kernel: netlink route sockets live in the
            // sentry (no host socket), packet sockets need CAP_NET_RAW, the
            // rest do not exist there.
            &[
                "socket(AF_UNIX) ok",
                "socket(AF_INET) ok",
                "socket(AF_INET6) ok",
                "socket(AF_NETLINK) ok",
                "socket(AF_PACKET) EPERM",
                "socket(AF_KEY) EAFNOSUPPORT",
                "socket(AF_ALG) EAFNOSUPPORT",
                "socket(AF_VSOCK) EAFNOSUPPORT",
                "socket(AF_APPLETALK) EAFNOSUPPORT",
                "socketpair(AF_UNIX) ok",
                "socketpair(AF_INET) ESOCKTNOSUPPORT",
                "socketpair(AF_NETLINK) ENOTSUP",
            ]
        };
        assert_eq!(lines, expected, "{runtime}");
        harness.assert_clean().await;
    }
}

/// Each probe runs in a child, so a probe killed by seccomp still lets the
/// next one run; prints what it returned or the signal that ended it.
const COMPAT_PROBE: &str = r#"
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static long int80(long number) {
    long ret;
    __asm__ volatile("int $0x80" : "=a"(ret) : "a"(number) : "memory");
    return ret;
}

static void probe(const char *what, int which) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        long ret;
        char buffer[64];
        errno = 0;
        if (which == 0) {
            ret = int80(20); /* getpid in the i386 table */
        } else if (which == 1) {
            ret = syscall(0x40000000L | SYS_getpid); /* x32 */
        } else {
            ret = syscall(SYS_modify_ldt, 0, buffer, sizeof buffer);
        }
        if (ret == -1 && errno != 0) {
            printf("%s %s\n", what, strerrorname_np(errno));
        } else if (which == 0 && ret > 0) {
            printf("%s returned a pid\n", what);
        } else {
            printf("%s returned %ld\n", what, ret);
        }
        fflush(stdout);
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    if (WIFSIGNALED(status)) {
        printf("%s killed by SIG%s\n", what, sigabbrev_np(WTERMSIG(status)));
    }
}

int main(void) {
    probe("int 0x80 getpid", 0);
    probe("x32 getpid", 1);
    probe("modify_ldt", 2);
    return 0;
}
"#;

#[tokio::test]
async fn compat_system_calls_and_modify_ldt_are_refused() {
    for (runtime, harness) in
        harness_per_runtime("compat_system_calls_and_modify_ldt_are_refused").await
    {
        let lines = run_ok(runtime, &harness, &job("c", "main.c", COMPAT_PROBE)).await;
        let expected: &[&str] = if runtime == "runc" {
            // A system call of an architecture the filter does not list is
            // answered by seccomp's bad-architecture action: the process is
            // killed with SIGSYS, the call never reaches the kernel.
            &[
                "int 0x80 getpid killed by SIGSYS",
                "x32 getpid killed by SIGSYS",
                "modify_ldt EPERM",
            ]
        } else {
            // gVisor implements neither compat ABI nor modify_ldt.
            &[
                "int 0x80 getpid returned -9",
                "x32 getpid ENOSYS",
                "modify_ldt EPERM",
            ]
        };
        assert_eq!(lines, expected, "{runtime}");
        harness.assert_clean().await;
    }
}

/// The shipped profile with modify_ldt allowed again and the x86 and x32
/// sub-architectures back, as in Docker's default profile.
fn reopened_profile() -> String {
    let mut profile: serde_json::Value = serde_json::from_str(EMBEDDED_PROFILE).unwrap();
    profile["archMap"][0]["subArchitectures"] =
        serde_json::json!(["SCMP_ARCH_X86", "SCMP_ARCH_X32"]);
    profile["syscalls"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"names": ["modify_ldt"], "action": "SCMP_ACT_ALLOW"}));
    profile.to_string()
}

#[tokio::test]
async fn a_profile_that_reopens_a_door_needs_the_override() {
    let harness = CliHarness::new().await;
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("profile.json");
    std::fs::write(&profile, reopened_profile()).unwrap();
    let program = dir.path().join("main.c");
    std::fs::write(&program, COMPAT_PROBE).unwrap();
    let run = |allow: Option<&str>| {
        let mut command: Command = harness.command();
        command
            .args(["sandbox", "run"])
            .arg(&program)
            .env("CODE_RUNNER_SECCOMP_PROFILE", &profile)
            .stdin(Stdio::null());
        if let Some(allow) = allow {
            command.env("CODE_RUNNER_SECCOMP_ALLOW", allow);
        }
        command.output().expect("code-runner runs")
    };

    let refused = run(None);
    assert_eq!(refused.status.code(), Some(64), "{refused:?}");
    assert_eq!(
        String::from_utf8_lossy(&refused.stderr),
        "code-runner: invalid configuration: CODE_RUNNER_SECCOMP_PROFILE: seccomp profile \
         re-opens compat-abi: archMap gives SCMP_ARCH_X86_64 the sub-architecture SCMP_ARCH_X86; \
         list compat-abi in CODE_RUNNER_SECCOMP_ALLOW to run it anyway\n"
    );
    // Naming one door is not enough for a profile that re-opens two.
    let half = run(Some("compat-abi"));
    assert_eq!(half.status.code(), Some(64), "{half:?}");
    assert!(
        String::from_utf8_lossy(&half.stderr)
            .contains("re-opens modify_ldt: a rule allows modify_ldt"),
        "{half:?}"
    );
    let unknown = run(Some("compat-abi,ptrace"));
    assert_eq!(unknown.status.code(), Some(64), "{unknown:?}");
    assert_eq!(
        String::from_utf8_lossy(&unknown.stderr),
        "code-runner: invalid configuration: CODE_RUNNER_SECCOMP_ALLOW: \"ptrace\" is not one of \
         socket-families, compat-abi, modify_ldt\n"
    );

    // With both named, the operator's profile is the one applied.
    let allowed = run(Some("compat-abi, modify_ldt"));
    assert_eq!(allowed.status.code(), Some(0), "{allowed:?}");
    assert_eq!(
        String::from_utf8_lossy(&allowed.stdout),
        "int 0x80 getpid returned a pid\nx32 getpid ENOSYS\nmodify_ldt returned 0\n"
    );
    harness.assert_clean().await;
}
