//! The stage filter: the seccomp program every process of a stage runs
//! under (`ptrace` answers `EPERM`; in a watched stage the calls that can
//! wait for stdin stop for the tracer, with what the tracer needs in the
//! stop's data: see [`super`]), assembled from labelled operations, and
//! installed in the forked child just before its exec.

use std::collections::HashMap;
use std::sync::OnceLock;

use nix::libc;

use super::ptrace::ptrace_with_value;
use super::{
    KIND_EPOLL_ADD, KIND_EPOLL_DEL, KIND_EPOLL_WAIT, KIND_READ, KIND_SHIFT, KIND_STDIN_CHANGED,
    MAX_EPOLL_FD,
};
use crate::bpf::{
    AUDIT_ARCH, BPF_ALU_OR_K, BPF_JMP_JEQ_K, BPF_JMP_JGE_K, BPF_LD_W_ABS, BPF_RET_A, BPF_RET_K,
    DATA_ARCH, DATA_NR, SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO, SECCOMP_RET_TRACE, X32_SYSCALL_BIT,
    data_arg_low, install, jump, statement,
};

/// `epoll_ctl`'s operation that removes a descriptor from the set.
const EPOLL_CTL_DEL: u32 = 2;

/// A label in the filter program being assembled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Label {
    Next,
    Allow,
    Deny,
    Read,
    EpollCtl,
    EpollWait,
    EpollWaitAny,
    Dup,
    Close,
    Trace(u32),
}

enum Op {
    Statement(u16, u32),
    Jump(u16, u32, Label, Label),
    /// Where a label points.
    Here(Label),
}

/// The stage filter, built before the fork (the child only installs it).
#[derive(Debug, Clone)]
pub(crate) struct StageFilter {
    program: Vec<libc::sock_filter>,
    /// The unwatched program, for a watched stage whose process cannot be
    /// traced (a kernel with Yama's ptrace_scope at 3 refuses even
    /// PTRACE_TRACEME): its traced calls would fail with ENOSYS untraced.
    untraced: Option<Vec<libc::sock_filter>>,
}

impl StageFilter {
    /// The filter of a watched stage or of any other: built once, as its
    /// programs never change.
    pub(crate) fn get(watch: bool) -> &'static Self {
        static WATCHED: OnceLock<StageFilter> = OnceLock::new();
        static UNWATCHED: OnceLock<StageFilter> = OnceLock::new();
        let slot = if watch { &WATCHED } else { &UNWATCHED };
        slot.get_or_init(|| Self::new(watch))
    }

    fn new(watch: bool) -> Self {
        Self {
            program: Self::program(watch),
            untraced: watch.then(|| Self::program(false)),
        }
    }

    fn program(watch: bool) -> Vec<libc::sock_filter> {
        use Label::*;
        let mut ops = vec![
            Op::Statement(BPF_LD_W_ABS, DATA_ARCH),
            // Another architecture's table: the container's profile decides.
            Op::Jump(BPF_JMP_JEQ_K, AUDIT_ARCH, Next, Allow),
            Op::Statement(BPF_LD_W_ABS, DATA_NR),
            Op::Jump(BPF_JMP_JGE_K, X32_SYSCALL_BIT, Allow, Next),
            Op::Jump(BPF_JMP_JEQ_K, libc::SYS_ptrace as u32, Deny, Next),
        ];
        if watch {
            let mut calls = vec![
                (libc::SYS_read, Read),
                (libc::SYS_readv, Read),
                (libc::SYS_epoll_ctl, EpollCtl),
                (libc::SYS_epoll_pwait, EpollWait),
                (libc::SYS_epoll_pwait2, EpollWaitAny),
                (libc::SYS_dup3, Dup),
                (libc::SYS_close, Close),
                (libc::SYS_close_range, Close),
            ];
            #[cfg(target_arch = "x86_64")]
            calls.extend([(libc::SYS_epoll_wait, EpollWait), (libc::SYS_dup2, Dup)]);
            for (number, label) in calls {
                ops.push(Op::Jump(BPF_JMP_JEQ_K, number as u32, label, Next));
            }
        }
        // None of the above: allow (the first of the returns, all at the
        // end, since BPF jumps only go forward).
        ops.push(Op::Jump(BPF_JMP_JEQ_K, 0, Allow, Allow));
        if watch {
            let trace = |kind: u32| SECCOMP_RET_TRACE | (kind << KIND_SHIFT);
            ops.extend([
                // read(0, …), readv(0, …)
                Op::Here(Read),
                Op::Statement(BPF_LD_W_ABS, data_arg_low(0)),
                Op::Jump(BPF_JMP_JEQ_K, 0, Trace(KIND_READ), Allow),
                // epoll_ctl(epfd, op, 0, …)
                Op::Here(EpollCtl),
                Op::Statement(BPF_LD_W_ABS, data_arg_low(2)),
                Op::Jump(BPF_JMP_JEQ_K, 0, Next, Allow),
                Op::Statement(BPF_LD_W_ABS, data_arg_low(1)),
                Op::Jump(BPF_JMP_JEQ_K, EPOLL_CTL_DEL, Next, Trace(KIND_EPOLL_ADD)),
                Op::Statement(BPF_LD_W_ABS, data_arg_low(0)),
                Op::Jump(BPF_JMP_JGE_K, MAX_EPOLL_FD, Allow, Next),
                Op::Statement(BPF_ALU_OR_K, trace(KIND_EPOLL_DEL)),
                Op::Statement(BPF_RET_A, 0),
                Op::Here(Trace(KIND_EPOLL_ADD)),
                Op::Statement(BPF_LD_W_ABS, data_arg_low(0)),
                Op::Jump(BPF_JMP_JGE_K, MAX_EPOLL_FD, Allow, Next),
                Op::Statement(BPF_ALU_OR_K, trace(KIND_EPOLL_ADD)),
                Op::Statement(BPF_RET_A, 0),
                // epoll_wait(epfd, …, timeout ≠ 0), epoll_pwait likewise
                Op::Here(EpollWait),
                Op::Statement(BPF_LD_W_ABS, data_arg_low(3)),
                Op::Jump(BPF_JMP_JEQ_K, 0, Allow, EpollWaitAny),
                // epoll_pwait2 (its timeout is a pointer), and the above
                Op::Here(EpollWaitAny),
                Op::Statement(BPF_LD_W_ABS, data_arg_low(0)),
                Op::Jump(BPF_JMP_JGE_K, MAX_EPOLL_FD, Allow, Next),
                Op::Statement(BPF_ALU_OR_K, trace(KIND_EPOLL_WAIT)),
                Op::Statement(BPF_RET_A, 0),
                // dup2(_, 0), dup3(_, 0, _)
                Op::Here(Dup),
                Op::Statement(BPF_LD_W_ABS, data_arg_low(1)),
                Op::Jump(BPF_JMP_JEQ_K, 0, Trace(KIND_STDIN_CHANGED), Allow),
                // close(0), close_range(0, …)
                Op::Here(Close),
                Op::Statement(BPF_LD_W_ABS, data_arg_low(0)),
                Op::Jump(BPF_JMP_JEQ_K, 0, Trace(KIND_STDIN_CHANGED), Allow),
                Op::Here(Trace(KIND_READ)),
                Op::Statement(BPF_RET_K, trace(KIND_READ)),
                Op::Here(Trace(KIND_STDIN_CHANGED)),
                Op::Statement(BPF_RET_K, trace(KIND_STDIN_CHANGED)),
            ]);
        }
        ops.extend([
            Op::Here(Allow),
            Op::Statement(BPF_RET_K, SECCOMP_RET_ALLOW),
            Op::Here(Deny),
            Op::Statement(BPF_RET_K, SECCOMP_RET_ERRNO | libc::EPERM as u32),
        ]);
        assemble(&ops)
    }

    /// In the forked child, just before exec: asks to be traced when the
    /// stage is watched, then installs the filter (see [`install`]); the
    /// unwatched one if the kernel refuses the trace (the stage then runs,
    /// without `input_wanted`). Only system calls, no allocation.
    pub(crate) fn apply_in_child(&self, traced: bool) -> std::io::Result<()> {
        if let (true, Some(untraced)) = (traced, &self.untraced)
            && ptrace_with_value(libc::PTRACE_TRACEME, 0, 0) != 0
        {
            return install(untraced);
        }
        install(&self.program)
    }
}

/// Resolves the labels: `Next` is the next instruction, every other label
/// the instruction after its `Here`. Jumps only go forward (BPF's rule).
fn assemble(ops: &[Op]) -> Vec<libc::sock_filter> {
    let mut positions = HashMap::new();
    let mut index = 0usize;
    for op in ops {
        match op {
            Op::Here(label) => {
                positions.insert(*label, index);
            }
            _ => index += 1,
        }
    }
    let mut program = Vec::with_capacity(index);
    for op in ops {
        let at = program.len();
        let offset = |label: Label| -> u8 {
            let target = match label {
                Label::Next => at + 1,
                label => positions[&label],
            };
            u8::try_from(target - at - 1).expect("a filter jump fits in a byte")
        };
        match op {
            Op::Statement(code, k) => program.push(statement(*code, *k)),
            Op::Jump(code, k, yes, no) => program.push(jump(*code, *k, offset(*yes), offset(*no))),
            Op::Here(_) => {}
        }
    }
    program
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unwatched_filter_only_denies_ptrace() {
        let filter = StageFilter::new(false);
        assert!(filter.untraced.is_none());
        let program = filter.program;
        assert_eq!(program.len(), 8);
        assert_eq!(
            (program[4].code, program[4].k, program[4].jt, program[4].jf),
            (BPF_JMP_JEQ_K, libc::SYS_ptrace as u32, 2, 0)
        );
        assert_eq!((program[5].jt, program[5].jf), (0, 0));
        assert_eq!(program[6].k, SECCOMP_RET_ALLOW);
        assert_eq!(program[7].k, SECCOMP_RET_ERRNO | libc::EPERM as u32);
    }

    #[test]
    fn every_jump_of_the_watched_filter_lands_inside_it() {
        let filter = StageFilter::new(true);
        assert_eq!(filter.untraced, Some(StageFilter::new(false).program));
        let program = filter.program;
        for (at, instruction) in program.iter().enumerate() {
            if instruction.code & 0x07 == 0x05 {
                assert!(at + 1 + usize::from(instruction.jt) < program.len());
                assert!(at + 1 + usize::from(instruction.jf) < program.len());
            }
        }
        let last = program.last().unwrap();
        assert_eq!(
            (last.code, last.k),
            (BPF_RET_K, SECCOMP_RET_ERRNO | libc::EPERM as u32)
        );
    }
}
