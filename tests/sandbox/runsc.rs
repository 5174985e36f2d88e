//! The same engine under gVisor (`runsc`): no change but the runtime.
//!
//! Runs only when `CODE_RUNNER_TEST_RUNSC=1` (scripts/test sets it when runsc
//! is registered with dockerd); otherwise each test says it is skipped.

use crate::common;
use crate::common::paths::on_every_start_path;
use crate::jobs::base64;

use code_runner::job::Status;
use code_runner::job::limits::LimitsRequest;
use code_runner::protocol::Reason;
use common::{Harness, job, job_with_limits, python, stdout, stdout_lines};

async fn hello_world_runs_under_gvisor(harness: Harness) {
    assert_eq!(harness.engine.config().runtime.as_deref(), Some("runsc"));
    // gVisor's own kernel answers uname, not the host's: proof that the
    // program ran under runsc.
    let result = harness
        .run(&python(
            "import os\nprint('hello from gvisor')\nprint(os.uname().release)",
        ))
        .await;
    assert_eq!(result.status, Status::Succeeded, "{result:#?}");
    let run = result.run.as_ref().unwrap();
    assert_eq!(run.exit_code, Some(0));
    assert_eq!(run.reason, Reason::Exited);
    let host_release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let lines = stdout_lines(&result);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0], "hello from gvisor");
    assert_ne!(
        lines[1],
        host_release.trim(),
        "the sandbox saw the host kernel: not gVisor"
    );
    harness.assert_clean().await;
}

/// The supervisor may trace (it holds CAP_SYS_PTRACE inside gVisor's
/// kernel, to trace interactive stages); user code may not: its stage
/// filter answers EPERM to every ptrace request, its own or a child's.
async fn user_code_cannot_ptrace_under_gvisor(harness: Harness) {
    let result = harness
        .run(&python(
            r#"
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
def call(name, *args):
    ctypes.set_errno(0)
    r = libc.syscall(101, *args)
    print(name, errno.errorcode.get(ctypes.get_errno(), 0) if r == -1 else f"returned {r}", flush=True)
call("traceme", 0, 0, 0, 0)
call("attach 1", 16, 1, 0, 0)
pid = os.fork()
if pid == 0:
    call("child traceme", 0, 0, 0, 0)
    os._exit(0)
os.waitpid(pid, 0)
"#,
        ))
        .await;
    assert_eq!(result.status, Status::Succeeded, "{result:#?}");
    assert_eq!(
        stdout_lines(&result),
        ["traceme EPERM", "attach 1 EPERM", "child traceme EPERM"]
    );
    harness.assert_clean().await;
}

/// Under gVisor the memory limit ends the whole sandbox (the host's OOM
/// killer takes its kernel), so output the supervisor had not forwarded yet
/// is lost with it (docs/security.md). The program waits half a second
/// after its line, so the line has left the sandbox before the bomb: what
/// this proves is the verdict and that output written before it is kept.
async fn memory_bomb_hits_the_memory_limit_under_gvisor(harness: Harness) {
    let spec = job_with_limits(
        "python",
        "main.py",
        "import time\nprint('allocating', flush=True)\ntime.sleep(0.5)\nchunks = []\nwhile True:\n    chunks.append(b'x' * (8 << 20))\n",
        LimitsRequest {
            memory_mb: Some(64),
            ..Default::default()
        },
    );
    let result = harness.run(&spec).await;
    assert_eq!(result.status, Status::Failed, "{result:#?}");
    let run = result.run.as_ref().unwrap();
    assert_eq!(run.reason, Reason::MemoryLimit, "{result:#?}");
    assert_eq!(run.exit_code, None);
    assert_eq!(run.signal.as_deref(), Some("SIGKILL"));
    assert_eq!(stdout(&result), "allocating\n");
    assert_eq!(result.error, None);
    harness.assert_clean().await;
}

async fn the_network_is_loopback_only_under_gvisor(harness: Harness) {
    // Only 127.0.0.1 and the TEST-NET address 192.0.2.1 are probed; the
    // sandbox has no network, so nothing leaves it.
    let spec = python(
        r#"
import errno, os, socket
def connect(host):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect((host, 80))
        return "connected"
    except socket.timeout:
        return "timeout"
    except OSError as e:
        return errno.errorcode.get(e.errno, e.errno)
    finally:
        s.close()
print("127.0.0.1:80", connect("127.0.0.1"))
print("192.0.2.1:80", connect("192.0.2.1"))
print("interfaces", sorted(os.listdir("/sys/class/net")))
"#,
    );
    let result = harness.run(&spec).await;
    assert_eq!(result.status, Status::Succeeded, "{result:#?}");
    // gVisor's netstack answers with its own errno for an address with no
    // route: EHOSTUNREACH where Linux says ENETUNREACH (see `escape`).
    assert_eq!(
        stdout_lines(&result),
        [
            "127.0.0.1:80 ECONNREFUSED",
            "192.0.2.1:80 EHOSTUNREACH",
            "interfaces ['lo']",
        ]
    );
    harness.assert_clean().await;
}

async fn stdin_is_echoed_byte_exact_under_gvisor(harness: Harness) {
    let input = "first line\nsecond ünïcode line, no newline at the end";
    let mut spec = python("import sys\nsys.stdout.buffer.write(sys.stdin.buffer.read())");
    spec.stdin = input.to_string();
    let result = harness.run(&spec).await;
    assert_eq!(result.status, Status::Succeeded, "{result:#?}");
    assert_eq!(stdout(&result), input);

    // Binary bytes through `cat`, too.
    let mut spec = job("bash", "main.sh", "cat");
    let bytes: Vec<u8> = (0..=255u8).rev().chain([0, 0xff, 0xc3]).collect();
    spec.stdin = base64(&bytes);
    spec.stdin_encoding = code_runner::job::Encoding::Base64;
    let result = harness.run(&spec).await;
    assert_eq!(result.status, Status::Succeeded, "{result:#?}");
    assert_eq!(
        result.run.as_ref().unwrap().stdout.as_bytes(),
        bytes.as_slice()
    );
    harness.assert_clean().await;
}

async fn fork_bomb_is_contained_under_gvisor(harness: Harness) {
    // Under runsc the job's process count is held inside gVisor (the pids
    // cgroup also counts gVisor's own host threads): the bomb fails to fork,
    // and the job runs into its wall limit with the sandbox still reporting.
    // The default limits are proven over many runs in `runsc_hostile`.
    for pids in [Some(16), Some(24)] {
        let spec = job_with_limits(
            "bash",
            "main.sh",
            "bomb() { bomb | bomb & }; bomb; sleep 30",
            LimitsRequest {
                pids,
                wall_ms: Some(3000),
                ..Default::default()
            },
        );
        let result = harness.run(&spec).await;
        assert_eq!(
            result.status,
            Status::TimedOut,
            "pids {pids:?}: {result:#?}"
        );
        assert_eq!(result.error, None);
        let run = result.run.as_ref().unwrap();
        assert_eq!(run.reason, Reason::WallTimeout);
        // Not known: gVisor's kernel enforces the limit and counts no
        // refusals, and no pids cgroup is there to read.
        assert_eq!(run.pids_limit_reached, None, "pids {pids:?}: {result:#?}");
        assert!(
            common::stderr(&result).contains("Resource temporarily unavailable"),
            "pids {pids:?}: the bomb should have hit the process limit: {:?}",
            common::stderr(&result)
        );
    }
    harness.assert_clean().await;
}

// Each test above, once per start path, when runsc tests are enabled.
on_every_start_path!(
    runsc:
    hello_world_runs_under_gvisor,
    user_code_cannot_ptrace_under_gvisor,
    memory_bomb_hits_the_memory_limit_under_gvisor,
    the_network_is_loopback_only_under_gvisor,
    stdin_is_echoed_byte_exact_under_gvisor,
    fork_bomb_is_contained_under_gvisor,
);
