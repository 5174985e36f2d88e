//! One uid per live sandbox on a host.
//!
//! Per-uid kernel limits (inotify instances, pending signals, mqueue bytes,
//! RLIMIT_NPROC) are counted per uid across every container of a host that
//! shares the initial user namespace. If every sandbox ran as the same uid,
//! one job could use them up for its neighbours. So each sandbox gets a uid
//! (and the same gid) of its own when it is created, and gives it back once
//! its container is removed.
//!
//! Several engines may share a host (workers of different fleets, a `sandbox
//! run`, tests). Each engine takes a *range* of [`RANGE_SIZE`] uids by
//! holding an exclusive `flock` on a file of the host-wide lock directory
//! (`range-<k>`): the range is `base + k * RANGE_SIZE ..`. The lock lives as
//! long as the engine (the kernel drops it when the process dies), so two
//! live engines never hold the same range, and within a range the engine
//! hands uids out itself. A range's previous holder may have died leaving
//! containers behind (until the reaper removes them): their uids are *busy*
//! and skipped ([`UidRange::refresh_busy`], from every container listing).
//!
//! A graded job's runs execute as [`runs_uid`] of the sandbox's uid (the
//! sandbox's plus the size of all ranges): as unique on the host, and never
//! any sandbox's own.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use nix::fcntl::{Flock, FlockArg};

/// Uids per range: room for the most slots and warm sandboxes a worker may
/// have (1024 each) with a margin. The same on every host, so ranges of
/// engines with different settings never overlap.
pub const RANGE_SIZE: u32 = 4096;
/// Ranges per host.
pub const MAX_RANGES: u32 = 1024;
/// The first uid of range 0 by default: above the ids Debian gives to users
/// (1000–59999) and to `nobody` (65534).
pub const DEFAULT_UID_BASE: u32 = 100_000;
/// Where the range locks live by default (host-wide, cleared at boot).
pub const DEFAULT_LOCK_DIR: &str = "/run/code-runner/uid-ranges";

#[derive(Debug, thiserror::Error)]
pub enum UidError {
    #[error("cannot create the uid lock directory {path:?}: {source}")]
    LockDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot open the uid range lock {path:?}: {source}")]
    LockFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("all {MAX_RANGES} sandbox uid ranges under {dir:?} are held by other processes")]
    NoRange { dir: PathBuf },
    #[error("uid base {base} leaves no room for {MAX_RANGES} ranges of {RANGE_SIZE} uids")]
    Base { base: u32 },
    #[error("every sandbox uid of range {first}..{last} is in use")]
    Exhausted { first: u32, last: u32 },
}

/// This engine's range of sandbox uids; cheap to clone.
#[derive(Debug, Clone)]
pub struct UidRange {
    inner: Arc<RangeInner>,
}

#[derive(Debug)]
struct RangeInner {
    first: u32,
    /// Uids handed out and not given back.
    leased: Mutex<Leases>,
    /// Held for the life of the engine: the range is ours while it is.
    _lock: Flock<File>,
}

#[derive(Debug, Default)]
struct Leases {
    leased: BTreeSet<u32>,
    /// Uids of containers in this range that this engine did not create.
    busy: BTreeSet<u32>,
}

/// The uid a graded job's tests run as in a sandbox of `uid` (see the
/// supervisor's run plan): as unique on the host as `uid` is, above every
/// range, so never any sandbox's own.
pub fn runs_uid(uid: u32) -> u32 {
    uid.saturating_add(RANGE_SIZE * MAX_RANGES)
}

/// A sandbox's uid, given back when dropped (once its container is gone).
#[derive(Debug)]
pub struct UidLease {
    uid: u32,
    range: Arc<RangeInner>,
}

impl UidLease {
    pub fn uid(&self) -> u32 {
        self.uid
    }
}

impl Drop for UidLease {
    fn drop(&mut self) {
        self.range.leases().leased.remove(&self.uid);
    }
}

impl RangeInner {
    fn leases(&self) -> std::sync::MutexGuard<'_, Leases> {
        self.leased.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl UidRange {
    /// Takes the first free range under `dir` (created if missing).
    pub fn acquire(dir: &Path, base: u32) -> Result<Self, UidError> {
        // Room for the ranges and, above them, the tests' uids.
        if base.checked_add(2 * RANGE_SIZE * MAX_RANGES).is_none() {
            return Err(UidError::Base { base });
        }
        std::fs::create_dir_all(dir).map_err(|source| UidError::LockDir {
            path: dir.to_path_buf(),
            source,
        })?;
        for k in 0..MAX_RANGES {
            let path = dir.join(format!("range-{k}"));
            let file = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .map_err(|source| UidError::LockFile {
                    path: path.clone(),
                    source,
                })?;
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => {
                    return Ok(Self {
                        inner: Arc::new(RangeInner {
                            first: base + k * RANGE_SIZE,
                            leased: Mutex::new(Leases::default()),
                            _lock: lock,
                        }),
                    });
                }
                Err((_, nix::errno::Errno::EWOULDBLOCK)) => continue,
                Err((_, errno)) => {
                    return Err(UidError::LockFile {
                        path,
                        source: std::io::Error::from(errno),
                    });
                }
            }
        }
        Err(UidError::NoRange {
            dir: dir.to_path_buf(),
        })
    }

    /// The uids of this range: `first..first + RANGE_SIZE`.
    pub fn first(&self) -> u32 {
        self.inner.first
    }

    pub fn contains(&self, uid: u32) -> bool {
        (self.inner.first..self.inner.first + RANGE_SIZE).contains(&uid)
    }

    /// The lowest uid neither leased nor busy.
    pub fn lease(&self) -> Result<UidLease, UidError> {
        let first = self.inner.first;
        let mut leases = self.inner.leases();
        let uid = (first..first + RANGE_SIZE)
            .find(|uid| !leases.leased.contains(uid) && !leases.busy.contains(uid))
            .ok_or(UidError::Exhausted {
                first,
                last: first + RANGE_SIZE - 1,
            })?;
        leases.leased.insert(uid);
        Ok(UidLease {
            uid,
            range: Arc::clone(&self.inner),
        })
    }

    /// Marks as busy the uids in this range of the live containers of this
    /// host that this engine did not lease (a dead previous holder's), and
    /// frees those no container has any more.
    pub fn refresh_busy(&self, container_uids: impl IntoIterator<Item = u32>) {
        let mut leases = self.inner.leases();
        let busy: BTreeSet<u32> = container_uids
            .into_iter()
            .filter(|uid| self.contains(*uid) && !leases.leased.contains(uid))
            .collect();
        leases.busy = busy;
    }

    /// How many uids are leased now.
    pub fn leased(&self) -> usize {
        self.inner.leases().leased.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_engines_get_disjoint_ranges_and_a_freed_range_is_taken_again() {
        let dir = tempfile::tempdir().unwrap();
        let a = UidRange::acquire(dir.path(), 200_000).unwrap();
        let b = UidRange::acquire(dir.path(), 200_000).unwrap();
        assert_eq!(a.first(), 200_000);
        assert_eq!(b.first(), 200_000 + RANGE_SIZE);
        drop(a);
        let c = UidRange::acquire(dir.path(), 200_000).unwrap();
        assert_eq!(c.first(), 200_000, "the lock of a dropped range is free");
        assert!(c.contains(200_000) && !c.contains(200_000 + RANGE_SIZE));
    }

    #[test]
    fn leases_are_unique_until_given_back() {
        let dir = tempfile::tempdir().unwrap();
        let range = UidRange::acquire(dir.path(), 300_000).unwrap();
        let one = range.lease().unwrap();
        let two = range.lease().unwrap();
        assert_eq!((one.uid(), two.uid()), (300_000, 300_001));
        assert_eq!(range.leased(), 2);
        drop(one);
        assert_eq!(range.lease().unwrap().uid(), 300_000);
    }

    #[test]
    fn busy_uids_of_other_containers_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let range = UidRange::acquire(dir.path(), 400_000).unwrap();
        let mine = range.lease().unwrap();
        // An orphan uses 400_001; uids outside the range do not matter; our
        // own lease is not busy.
        range.refresh_busy([400_000, 400_001, 7, 65534]);
        assert_eq!(range.lease().unwrap().uid(), 400_002);
        range.refresh_busy([]);
        let next = range.lease().unwrap();
        assert_eq!(next.uid(), 400_001);
        drop(mine);
    }

    #[test]
    fn a_full_range_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let range = UidRange::acquire(dir.path(), 500_000).unwrap();
        range.refresh_busy(500_000..500_000 + RANGE_SIZE);
        assert!(matches!(range.lease(), Err(UidError::Exhausted { .. })));
        assert!(matches!(
            UidRange::acquire(dir.path(), u32::MAX - 10),
            Err(UidError::Base { .. })
        ));
    }
}
