//! The runs after the stages ([`RunPlan`]): a graded job's tests, a
//! checker's checks. Each run executes as the plan's uid, which owns
//! nothing of what the bundle and the stages left; between two runs the
//! supervisor removes whatever the last one added, so that every run finds
//! the sandbox exactly as the first one did.
//!
//! - [`Scratch::prepare`], once, as the stages' uid: every file the stages
//!   left that others may write loses that permission, every directory
//!   others may write in becomes sticky (so a run can neither change nor
//!   remove what it did not create), and the names each such directory
//!   holds are recorded.
//! - [`Scratch::write_run_files`], as the runs' uid: a fresh `files_dir`
//!   holding the run's files.
//! - [`Scratch::wipe`], after each run (every process of the runs' uid is
//!   dead by then): every entry of a recorded directory that was not there
//!   at the start is removed, the runs' own trees as the runs' uid, a hard
//!   link to a stage's file as the stages' uid.
//!
//! All of this works on directory descriptors (`openat`, `unlinkat`) and
//! never follows a symbolic link. The walk is bounded ([`MAX_ENTRIES`]): a
//! compile stage that left more gets a fatal error, not a partial guard.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, open, openat};
use nix::sys::stat::{FchmodatFlags, FileStat, Mode, SFlag, fchmodat, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};

use super::InitError;
use super::files::write_files_at;
use super::job_thread::run_as;
use code_runner_protocol::{BundleFile, RunPlan};

/// Most entries the start-of-runs walk looks at.
pub(crate) const MAX_ENTRIES: usize = 200_000;

const OTHERS_WRITE: u32 = 0o002;
const STICKY: u32 = 0o1000;

/// The directories a run could add entries to, with the names each held
/// when the runs began.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    /// Shared with each wipe's thread, not copied for it.
    dirs: Arc<Vec<(PathBuf, HashSet<OsString>)>>,
    plan_uid: u32,
    plan_gid: u32,
    stage_uid: u32,
    stage_gid: u32,
    files_dir: PathBuf,
}

fn fail(step: &str, path: &Path, errno: Errno) -> InitError {
    InitError::Runs(format!("{step} {}: {errno}", path.display()))
}

impl Scratch {
    /// Locks down and records the plan's scratch trees, as the stages' uid.
    pub(crate) fn prepare(
        plan: &RunPlan,
        stage_uid: u32,
        stage_gid: u32,
    ) -> Result<Self, InitError> {
        let roots: Vec<PathBuf> = plan.scratch.iter().map(PathBuf::from).collect();
        let dirs = run_as("runs-prepare", stage_uid, stage_gid, move || {
            let mut walk = Walk {
                stage_uid,
                seen: 0,
                dirs: Vec::new(),
            };
            for root in roots {
                match open(
                    &root,
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::empty(),
                ) {
                    Ok(fd) => walk.directory(fd, root, true)?,
                    // A mount this runtime does not have.
                    Err(Errno::ENOENT) => {}
                    Err(errno) => return Err(fail("cannot open", &root, errno)),
                }
            }
            Ok(walk.dirs)
        })?;
        Ok(Self {
            dirs: Arc::new(dirs),
            plan_uid: plan.uid,
            plan_gid: plan.gid,
            stage_uid,
            stage_gid,
            files_dir: PathBuf::from(&plan.files_dir),
        })
    }

    /// Creates the plan's `files_dir` and writes `files` into it, as the
    /// runs' uid. Nothing to do without files.
    pub(crate) fn write_run_files(&self, files: Vec<BundleFile>) -> Result<(), InitError> {
        if files.is_empty() {
            return Ok(());
        }
        let dir = self.files_dir.clone();
        run_as("run-files", self.plan_uid, self.plan_gid, move || {
            let (parent, name) = match (dir.parent(), dir.file_name()) {
                (Some(parent), Some(name)) => (parent.to_path_buf(), name.to_os_string()),
                _ => {
                    return Err(InitError::Runs(format!(
                        "files_dir {} has no parent",
                        dir.display()
                    )));
                }
            };
            let parent_fd = open(
                &parent,
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(|errno| fail("cannot open", &parent, errno))?;
            mkdirat(
                &parent_fd,
                name.as_os_str(),
                Mode::from_bits_truncate(0o755),
            )
            .map_err(|errno| fail("cannot create", &dir, errno))?;
            let root = openat(
                &parent_fd,
                name.as_os_str(),
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(|errno| fail("cannot open", &dir, errno))?;
            write_files_at(&root, &files)
        })
    }

    /// Removes every entry added to a recorded directory since the start.
    pub(crate) fn wipe(&self) -> Result<(), InitError> {
        let dirs = Arc::clone(&self.dirs);
        let plan_uid = self.plan_uid;
        // The runs' own entries go as the runs' uid; what it cannot remove
        // (a hard link to a stage's file) comes back for the stages' uid.
        let others = run_as("runs-wipe", self.plan_uid, self.plan_gid, move || {
            let mut others: HashMap<PathBuf, Vec<OsString>> = HashMap::new();
            for (path, names) in dirs.iter() {
                let fd = match open(
                    path,
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::empty(),
                ) {
                    Ok(fd) => fd,
                    Err(errno) => return Err(fail("cannot open", path, errno)),
                };
                for name in added_names(&fd, path, names)? {
                    let stat = fstatat(&fd, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                        .map_err(|errno| fail("cannot stat", &path.join(&name), errno))?;
                    if stat.st_uid == plan_uid {
                        remove_tree(&fd, &name, &stat, &path.join(&name), 0)?;
                    } else {
                        others.entry(path.clone()).or_default().push(name);
                    }
                }
            }
            Ok(others)
        })?;
        if others.is_empty() {
            return Ok(());
        }
        run_as(
            "runs-wipe-links",
            self.stage_uid,
            self.stage_gid,
            move || {
                for (path, names) in others {
                    let fd = open(
                        &path,
                        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                        Mode::empty(),
                    )
                    .map_err(|errno| fail("cannot open", &path, errno))?;
                    for name in names {
                        unlinkat(&fd, name.as_os_str(), UnlinkatFlags::NoRemoveDir)
                            .map_err(|errno| fail("cannot remove", &path.join(&name), errno))?;
                    }
                }
                Ok(())
            },
        )
    }
}

/// Empties the directories `roots` (absent ones skipped) as `uid`/`gid`,
/// the stages' uid, which owns what the job left in them (every process of
/// the job is dead by then): before a supervisor lingers, so that its
/// container holds none of the job's files.
pub(crate) fn empty_dirs(roots: &[String], uid: u32, gid: u32) -> Result<(), InitError> {
    let roots: Vec<PathBuf> = roots.iter().map(PathBuf::from).collect();
    run_as("linger-wipe", uid, gid, move || {
        for root in roots {
            let fd = match open(
                &root,
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            ) {
                Ok(fd) => fd,
                Err(Errno::ENOENT) => continue,
                Err(errno) => return Err(fail("cannot open", &root, errno)),
            };
            for name in added_names(&fd, &root, &HashSet::new())? {
                let path = root.join(&name);
                let stat = fstatat(&fd, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                    .map_err(|errno| fail("cannot stat", &path, errno))?;
                remove_tree(&fd, &name, &stat, &path, 0)?;
            }
        }
        Ok(())
    })
    .map_err(|error| match error {
        // The tree steps shared with the runs say their problem as a run's.
        InitError::Runs(problem) => InitError::Wipe(problem),
        other => other,
    })
}

/// The names in `fd` that are not in `names`.
fn added_names(
    fd: &OwnedFd,
    path: &Path,
    names: &HashSet<OsString>,
) -> Result<Vec<OsString>, InitError> {
    let mut dir = Dir::openat(
        fd,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| fail("cannot list", path, errno))?;
    let mut added = Vec::new();
    for entry in dir.iter() {
        let entry = entry.map_err(|errno| fail("cannot list", path, errno))?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name == "." || name == ".." || names.contains(name) {
            continue;
        }
        added.push(name.to_os_string());
    }
    Ok(added)
}

/// Removes `name` in `parent` (described by `stat`), a directory with all
/// it holds. Runs as the owner, who may make its own directories writable.
fn remove_tree(
    parent: &OwnedFd,
    name: &OsStr,
    stat: &FileStat,
    path: &Path,
    depth: usize,
) -> Result<(), InitError> {
    if SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits()) != SFlag::S_IFDIR {
        return unlinkat(parent, name, UnlinkatFlags::NoRemoveDir)
            .map_err(|errno| fail("cannot remove", path, errno));
    }
    if depth > 4096 {
        return Err(InitError::Runs(format!(
            "{} is nested too deep to remove",
            path.display()
        )));
    }
    // The owner may always give itself access to its own directory. No
    // process of the runs' uid is alive, so the entry checked above is the
    // one changed here (Linux has no chmod that refuses a symbolic link).
    fchmodat(
        parent,
        name,
        Mode::from_bits_truncate(0o700),
        FchmodatFlags::FollowSymlink,
    )
    .map_err(|errno| fail("cannot open up", path, errno))?;
    let fd = openat(
        parent,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| fail("cannot open", path, errno))?;
    let children = added_names(&fd, path, &HashSet::new())?;
    for child in children {
        let child_path = path.join(&child);
        let child_stat = fstatat(&fd, child.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|errno| fail("cannot stat", &child_path, errno))?;
        remove_tree(&fd, &child, &child_stat, &child_path, depth + 1)?;
    }
    drop(fd);
    unlinkat(parent, name, UnlinkatFlags::RemoveDir)
        .map_err(|errno| fail("cannot remove", path, errno))
}

/// The start-of-runs walk, as the stages' uid.
struct Walk {
    stage_uid: u32,
    seen: usize,
    dirs: Vec<(PathBuf, HashSet<OsString>)>,
}

impl Walk {
    /// Walks the directory open at `fd`; `root` marks a scratch mount.
    fn directory(&mut self, fd: OwnedFd, path: PathBuf, root: bool) -> Result<(), InitError> {
        let stat =
            nix::sys::stat::fstat(fd.as_fd()).map_err(|errno| fail("cannot stat", &path, errno))?;
        let mut mode = stat.st_mode & 0o7777;
        if stat.st_uid == self.stage_uid && mode & OTHERS_WRITE != 0 && mode & STICKY == 0 {
            // Others may write here: only as a sticky directory, where none
            // may remove or rename what another owns.
            mode |= STICKY;
            nix::sys::stat::fchmod(fd.as_fd(), Mode::from_bits_truncate(mode))
                .map_err(|errno| fail("cannot make sticky", &path, errno))?;
        }
        let names = added_names(&fd, &path, &HashSet::new())?;
        self.seen += names.len();
        if self.seen > MAX_ENTRIES {
            return Err(InitError::Runs(format!(
                "the stages left more than {MAX_ENTRIES} files in the sandbox's writable mounts"
            )));
        }
        for name in &names {
            let child = path.join(name);
            let stat = match fstatat(&fd, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(stat) => stat,
                Err(errno) => return Err(fail("cannot stat", &child, errno)),
            };
            let kind = SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits());
            let child_mode = stat.st_mode & 0o7777;
            if kind == SFlag::S_IFDIR {
                // Only directories this uid can enter can hold what others
                // could write into (others need search permission through
                // every parent, and the stages' uid has what others have).
                match openat(
                    &fd,
                    name.as_os_str(),
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::empty(),
                ) {
                    Ok(child_fd) => self.directory(child_fd, child, false)?,
                    Err(Errno::EACCES) if stat.st_uid != self.stage_uid => {}
                    Err(errno) => return Err(fail("cannot open", &child, errno)),
                }
            } else if kind != SFlag::S_IFLNK
                && stat.st_uid == self.stage_uid
                && child_mode & OTHERS_WRITE != 0
            {
                // Not a symbolic link (checked), and nothing of the job runs.
                fchmodat(
                    &fd,
                    name.as_os_str(),
                    Mode::from_bits_truncate(child_mode & !OTHERS_WRITE),
                    FchmodatFlags::FollowSymlink,
                )
                .map_err(|errno| fail("cannot take write access from others on", &child, errno))?;
            }
        }
        if root || mode & OTHERS_WRITE != 0 {
            self.dirs.push((path, names.into_iter().collect()));
        }
        Ok(())
    }
}
