//! The seccomp filter a run's process installs before it executes the
//! program: System V IPC, POSIX message queues and kernel keys answer
//! `EPERM`. Each of them keeps state in the kernel after every process of
//! the run is gone, where the next run could read it and the supervisor
//! could not reliably find it (gVisor has no `/proc/sysvipc`). Files in
//! `/dev/shm` are files, and the wipe between runs removes them.
//!
//! The filter is stacked on the container's own profile (the supervisor
//! runs with `no_new_privs`, so no privilege is needed to add one) and is
//! inherited by every process of the run. A system call of another
//! architecture's table (the x32 ABI, or the i386 table on x86_64) is
//! refused too: the denied numbers differ there.

use nix::libc;

use super::bpf::{
    AUDIT_ARCH, BPF_JMP_JEQ_K, BPF_JMP_JGE_K, BPF_LD_W_ABS, BPF_RET_K, DATA_ARCH, DATA_NR,
    SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO, X32_SYSCALL_BIT, install, jump, statement,
};

/// The system calls a run may not make.
const DENIED: [libc::c_long; 21] = [
    libc::SYS_shmget,
    libc::SYS_shmat,
    libc::SYS_shmctl,
    libc::SYS_shmdt,
    libc::SYS_msgget,
    libc::SYS_msgsnd,
    libc::SYS_msgrcv,
    libc::SYS_msgctl,
    libc::SYS_semget,
    libc::SYS_semop,
    libc::SYS_semtimedop,
    libc::SYS_semctl,
    libc::SYS_mq_open,
    libc::SYS_mq_unlink,
    libc::SYS_mq_timedsend,
    libc::SYS_mq_timedreceive,
    libc::SYS_mq_notify,
    libc::SYS_mq_getsetattr,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_keyctl,
];

/// The filter program, built before the fork (the child only installs it).
#[derive(Debug, Clone)]
pub(crate) struct RunFilter {
    program: Vec<libc::sock_filter>,
}

impl RunFilter {
    pub(crate) fn new() -> Self {
        let errno = SECCOMP_RET_ERRNO | (libc::EPERM as u32);
        let mut program = vec![
            statement(BPF_LD_W_ABS, DATA_ARCH),
            // Another architecture: refuse.
            jump(BPF_JMP_JEQ_K, AUDIT_ARCH, 1, 0),
            statement(BPF_RET_K, errno),
            statement(BPF_LD_W_ABS, DATA_NR),
            jump(BPF_JMP_JGE_K, X32_SYSCALL_BIT, 0, 1),
            statement(BPF_RET_K, errno),
        ];
        for number in DENIED {
            // Equal: go on to the `errno` return after this pair; else skip it.
            program.push(jump(BPF_JMP_JEQ_K, number as u32, 0, 1));
            program.push(statement(BPF_RET_K, errno));
        }
        program.push(statement(BPF_RET_K, SECCOMP_RET_ALLOW));
        Self { program }
    }

    /// Installs the filter on the calling thread (see [`install`]).
    pub(crate) fn install(&self) -> std::io::Result<()> {
        install(&self.program)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_denied_call_has_its_return_and_the_program_ends_allowing() {
        let filter = RunFilter::new();
        assert_eq!(filter.program.len(), 6 + 2 * DENIED.len() + 1);
        let last = filter.program.last().unwrap();
        assert_eq!((last.code, last.k), (BPF_RET_K, SECCOMP_RET_ALLOW));
        for pair in filter.program[6..filter.program.len() - 1].chunks(2) {
            assert_eq!(
                (pair[0].code, pair[0].jt, pair[0].jf),
                (BPF_JMP_JEQ_K, 0, 1)
            );
            assert_eq!(pair[1].k, SECCOMP_RET_ERRNO | libc::EPERM as u32);
        }
    }

    /// In a child process (the filter cannot be taken off again): a
    /// System V segment and a message queue are refused, a file is not.
    #[test]
    fn a_filtered_process_cannot_create_ipc_objects() {
        let filter = RunFilter::new();
        // SAFETY: fork in a test; the child only makes system calls and exits.
        #[allow(unsafe_code)]
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let code = (|| {
                if filter.install().is_err() {
                    return 10;
                }
                // SAFETY: plain system calls with integer arguments.
                #[allow(unsafe_code)]
                let shm = unsafe { libc::shmget(libc::IPC_PRIVATE, 4096, libc::IPC_CREAT | 0o600) };
                if shm != -1 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EPERM)
                {
                    return 11;
                }
                #[allow(unsafe_code)]
                let msg = unsafe { libc::msgget(libc::IPC_PRIVATE, libc::IPC_CREAT | 0o600) };
                if msg != -1 {
                    return 12;
                }
                if std::fs::metadata("/").is_err() {
                    return 13;
                }
                0
            })();
            // SAFETY: leave the forked test process at once.
            #[allow(unsafe_code)]
            unsafe {
                libc::_exit(code)
            };
        }
        let mut status = 0;
        // SAFETY: waiting for the child forked above.
        #[allow(unsafe_code)]
        let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(waited, pid);
        assert!(libc::WIFEXITED(status), "status {status}");
        assert_eq!(libc::WEXITSTATUS(status), 0);
    }
}
