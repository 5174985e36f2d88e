//! The `code-runner` binary run as a user runs it from a shell: to its
//! end, with what it printed ([`Ran`]), and stopped as Ctrl-C would stop it
//! if the test fails first ([`ChildGuard`]). Used by the CLI's tests with
//! Docker (`daemon::cli`) and without (`tools::cli`).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::drain;

/// What a finished command left.
#[derive(Debug)]
pub struct Ran {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `command` to its end (stdin is empty unless the command says otherwise).
pub fn run(mut command: Command) -> Ran {
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the code-runner binary starts");
    finish(ChildGuard(Some(child)))
}

/// Waits (up to 60 s) for a guarded child to end, collecting its piped
/// stdout and stderr; a child still running at the deadline fails the test
/// (and the guard stops it).
pub fn finish(mut guard: ChildGuard) -> Ran {
    let stdout = drain(guard.child().stdout.take());
    let stderr = drain(guard.child().stderr.take());
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = guard.child().try_wait().expect("waiting for code-runner") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "code-runner did not end within 60 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    Ran {
        code: status.code(),
        stdout: String::from_utf8_lossy(&stdout.join().unwrap()).into_owned(),
        stderr: String::from_utf8_lossy(&stderr.join().unwrap()).into_owned(),
    }
}

/// Stops a child that is still running when the test fails: SIGINT first
/// (the CLI then cancels its job and removes its container), SIGKILL if it
/// does not stop within 5 s.
pub struct ChildGuard(pub Option<Child>);

impl ChildGuard {
    pub fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("the child is guarded")
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let Some(child) = self.0.as_mut() else { return };
        if !matches!(child.try_wait(), Ok(None)) {
            return;
        }
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if !matches!(child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}
