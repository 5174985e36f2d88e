//! The ptrace requests the tracer makes, each a thin wrapper of one
//! `ptrace(2)` call (the module's only `unsafe`): the options every tracee
//! gets, resuming a stop, and reading what a stop carries.

use nix::libc;

/// What every tracee is set to: stop at the filter's trace returns, follow
/// forks, vforks, clones and execs, and die if the tracer does.
const OPTIONS: libc::c_int = libc::PTRACE_O_TRACESECCOMP
    | libc::PTRACE_O_TRACEFORK
    | libc::PTRACE_O_TRACEVFORK
    | libc::PTRACE_O_TRACECLONE
    | libc::PTRACE_O_TRACEEXEC
    | libc::PTRACE_O_EXITKILL;

/// `ptrace(request, pid, NULL, value)` for a request whose `data` is an
/// integer (PTRACE_TRACEME ignores it, PTRACE_SETOPTIONS takes the options,
/// PTRACE_CONT the signal): nothing is read or written through a pointer.
#[allow(unsafe_code)]
pub(super) fn ptrace_with_value(request: libc::c_uint, pid: i32, value: usize) -> libc::c_long {
    // SAFETY: `addr` is null and `data` an integer, as the requests above
    // take them; the kernel touches no memory of this process for them.
    unsafe {
        libc::ptrace(
            request,
            pid,
            std::ptr::null_mut::<libc::c_void>(),
            value as *mut libc::c_void,
        )
    }
}

/// What a ptrace request of this module writes through `data`: plain C
/// data, for which all-zero bytes are a valid value.
trait PtraceOut: Copy {}
/// PTRACE_GETEVENTMSG's.
impl PtraceOut for libc::c_ulong {}
/// PTRACE_GETSIGINFO's.
impl PtraceOut for libc::siginfo_t {}

/// `ptrace(request, pid, NULL, &value)` for a request that writes one `T`
/// through `data` (see [`PtraceOut`]). `None` when it fails.
#[allow(unsafe_code)]
fn ptrace_get<T: PtraceOut>(request: libc::c_uint, pid: i32) -> Option<T> {
    // SAFETY: `T` is plain C data, valid when zeroed (`PtraceOut`); the
    // request writes at most one `T` through `data`, which points to the
    // live local, for the duration of the call.
    let mut value: T = unsafe { std::mem::zeroed() };
    let result = unsafe {
        libc::ptrace(
            request,
            pid,
            std::ptr::null_mut::<libc::c_void>(),
            &mut value as *mut T,
        )
    };
    (result == 0).then_some(value)
}

pub(super) fn set_options(pid: i32) {
    ptrace_with_value(libc::PTRACE_SETOPTIONS, pid, OPTIONS as usize);
}

/// Lets a stopped tracee go on, delivering `signal` (0: none). A tracee
/// killed meanwhile makes this fail with ESRCH, which is fine.
pub(super) fn resume(pid: i32, signal: libc::c_int) {
    ptrace_with_value(libc::PTRACE_CONT, pid, signal as usize);
}

pub(super) fn event_message(pid: i32) -> Option<libc::c_ulong> {
    ptrace_get(libc::PTRACE_GETEVENTMSG, pid)
}

/// A stop for a signal (PTRACE_GETSIGINFO works), not a group stop.
pub(super) fn is_signal_delivery(pid: i32) -> bool {
    ptrace_get::<libc::siginfo_t>(libc::PTRACE_GETSIGINFO, pid).is_some()
}
