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

/// `BPF_LD | BPF_W | BPF_ABS` (the first two are 0).
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JMP_JEQ_K: u16 = 0x05 | 0x10;
const BPF_JMP_JGE_K: u16 = 0x05 | 0x30;
const BPF_RET_K: u16 = 0x06;

const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_MODE_FILTER: libc::c_ulong = 2;

/// Offsets in `struct seccomp_data`.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;

/// Numbers from here up are the x32 ABI on x86_64 (nothing on aarch64).
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

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

fn statement(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

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

    /// Installs the filter on the calling thread. Runs in the forked child
    /// between fork and exec: two `prctl` calls, no allocation.
    #[allow(unsafe_code)]
    pub(crate) fn install(&self) -> std::io::Result<()> {
        let program = libc::sock_fprog {
            len: self.program.len() as libc::c_ushort,
            filter: self.program.as_ptr().cast_mut(),
        };
        // SAFETY: prctl with PR_SET_NO_NEW_PRIVS takes integers only; with
        // PR_SET_SECCOMP it reads the `sock_fprog` and the filter array it
        // points to, both alive for the duration of the call (the array is
        // owned by `self`, borrowed here). Neither call allocates or takes
        // a lock, so both are safe between fork and exec.
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::prctl(
                libc::PR_SET_SECCOMP,
                SECCOMP_MODE_FILTER,
                &program as *const libc::sock_fprog,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
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
