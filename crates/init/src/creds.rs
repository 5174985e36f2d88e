//! Changing the credentials of the calling thread only.
//!
//! Linux (and gVisor) keep credentials per thread; glibc's `setresuid` and
//! `setresgid` make every thread of the process follow (through a signal
//! broadcast), which the supervisor must not do: only one dedicated thread
//! may take the job's ids. The raw system calls change the caller alone.
//! (`setfsuid` would be enough on Linux, but gVisor does not honour it.)

use nix::libc;
use nix::unistd::{getegid, geteuid, getgid, getuid};

/// `setresuid(real, effective, saved)` for the calling thread only.
pub(crate) fn set_thread_resuid(real: u32, effective: u32, saved: u32) -> std::io::Result<()> {
    raw_set_ids(libc::SYS_setresuid, real, effective, saved)
}

/// `setresgid(real, effective, saved)` for the calling thread only.
pub(crate) fn set_thread_resgid(real: u32, effective: u32, saved: u32) -> std::io::Result<()> {
    raw_set_ids(libc::SYS_setresgid, real, effective, saved)
}

/// Drops the calling thread to `uid`/`gid` for good (real, effective and
/// saved ids; its capabilities go with them), and checks that it did. The
/// thread can never become root again: use it only on a thread that ends
/// when its work is done.
pub(crate) fn drop_thread_to(uid: u32, gid: u32) -> std::io::Result<()> {
    // The gid first: changing it needs CAP_SETGID, which leaving uid 0 drops.
    set_thread_resgid(gid, gid, gid)?;
    set_thread_resuid(uid, uid, uid)?;
    if getuid().as_raw() == uid
        && geteuid().as_raw() == uid
        && getgid().as_raw() == gid
        && getegid().as_raw() == gid
    {
        Ok(())
    } else {
        Err(std::io::Error::other("the id switch did not take effect"))
    }
}

#[allow(unsafe_code)]
fn raw_set_ids(call: libc::c_long, real: u32, effective: u32, saved: u32) -> std::io::Result<()> {
    // SAFETY: setresuid/setresgid take three integers and touch no memory of
    // the process. Made as raw system calls they change only the calling
    // thread's credentials (see the module docs); nothing in the process
    // caches credentials, and the callers confine the changed thread to its
    // one task.
    let result = unsafe {
        libc::syscall(
            call,
            libc::c_long::from(real),
            libc::c_long::from(effective),
            libc::c_long::from(saved),
        )
    };
    if result == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropping_one_thread_leaves_the_others_alone() {
        if !getuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let uid = 4_300_000 + std::process::id() % 1000;
        let dropped = std::thread::spawn(move || {
            drop_thread_to(uid, uid).map(|()| (getuid().as_raw(), getgid().as_raw()))
        })
        .join()
        .expect("thread");
        assert_eq!(dropped.expect("drop"), (uid, uid));
        assert!(getuid().is_root() && geteuid().is_root());
        // The dropped thread could not have gone back.
        let back = std::thread::spawn(move || {
            drop_thread_to(uid, uid)?;
            set_thread_resuid(0, 0, 0)
        })
        .join()
        .expect("thread");
        assert!(back.is_err());
    }
}
