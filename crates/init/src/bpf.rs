//! Classic BPF for the seccomp filters the supervisor stacks on the
//! container's profile (`runs_filter`, `watch`): the opcodes they use, the
//! offsets in `struct seccomp_data`, and installing a program.

use nix::libc;

/// `BPF_LD | BPF_W | BPF_ABS` (the first two are 0).
pub(crate) const BPF_LD_W_ABS: u16 = 0x20;
pub(crate) const BPF_JMP_JEQ_K: u16 = 0x05 | 0x10;
pub(crate) const BPF_JMP_JGE_K: u16 = 0x05 | 0x30;
/// `BPF_ALU | BPF_OR | BPF_K`: A |= k.
pub(crate) const BPF_ALU_OR_K: u16 = 0x04 | 0x40;
pub(crate) const BPF_RET_K: u16 = 0x06;
/// `BPF_RET | BPF_A`: return the accumulator.
pub(crate) const BPF_RET_A: u16 = 0x06 | 0x10;

pub(crate) const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
pub(crate) const SECCOMP_RET_TRACE: u32 = 0x7ff0_0000;
pub(crate) const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_MODE_FILTER: libc::c_ulong = 2;

/// Offsets in `struct seccomp_data`.
pub(crate) const DATA_NR: u32 = 0;
pub(crate) const DATA_ARCH: u32 = 4;

/// The offset of the low 32 bits of system call argument `index` (both
/// architectures are little-endian).
pub(crate) const fn data_arg_low(index: u32) -> u32 {
    16 + 8 * index
}

#[cfg(target_arch = "x86_64")]
pub(crate) const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
pub(crate) const AUDIT_ARCH: u32 = 0xc000_00b7;

/// Numbers from here up are the x32 ABI on x86_64 (nothing on aarch64).
pub(crate) const X32_SYSCALL_BIT: u32 = 0x4000_0000;

pub(crate) fn statement(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

pub(crate) fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// Installs `program` on the calling thread. Runs in the forked child
/// between fork and exec: two `prctl` calls, no allocation.
#[allow(unsafe_code)]
pub(crate) fn install(program: &[libc::sock_filter]) -> std::io::Result<()> {
    let length = libc::c_ushort::try_from(program.len())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    let program = libc::sock_fprog {
        len: length,
        filter: program.as_ptr().cast_mut(),
    };
    // SAFETY: prctl with PR_SET_NO_NEW_PRIVS takes integers only; with
    // PR_SET_SECCOMP it reads the `sock_fprog` and the filter array it
    // points to, both alive for the duration of the call (the array is
    // borrowed here). Neither call allocates or takes a lock, so both are
    // safe between fork and exec.
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
