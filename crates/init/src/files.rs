//! Writing the bundle's files into the workspace.
//!
//! The supervisor cannot `chown` (no `CAP_CHOWN`), so the files must be
//! created by the job's uid in the first place. They are written on a
//! thread that has dropped *its own* credentials to the job's uid and gid
//! for good (see [`super::job_thread`] and [`super::creds`]: only that
//! thread changes, the rest of the supervisor stays root): no other code
//! ever runs with those credentials, and permission checks are exactly the
//! job's. This is cheaper than a child process and needs no second copy of
//! the files. (`setfsuid` would do on Linux, but gVisor ignores it.)
//!
//! Every path is checked again here (the worker checked it first), and the
//! files are created relative to directory file descriptors with
//! `O_NOFOLLOW`, `O_EXCL` and `O_DIRECTORY`, so a symlink in the workspace is
//! never followed.
//!
//! One exception to `O_EXCL`: a warm runtime that opens its main script at
//! its start (php) is given an empty [`Placeholder`] made here before
//! it starts; the job's file of that name is then written into that same
//! file (opened without `O_CREAT`, `O_NOFOLLOW`, and checked to be the very
//! inode made for it), which the runtime reads once released. Another: a
//! warm runtime fed its script through a FIFO (ruby) has that FIFO made
//! here, as a [`Placeholder`] too; the job's file of that name replaces it
//! in one step: it is written whole under a name of its own (created with
//! `O_EXCL` as always, before any other file), then renamed over the FIFO,
//! checked to be the very inode made for it. A runtime that opens its
//! script only now finds either the FIFO or the whole file.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat, renameat};
use nix::sys::stat::{Mode, fchmod, fstat, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, mkfifoat, unlinkat};

use super::InitError;
use super::job_thread::run_as;
use code_runner_protocol::BundleFile;

/// Most components in a bundle file path (`a/b/c` has three).
pub const MAX_PATH_DEPTH: usize = 16;
/// Longest bundle file path, in bytes.
pub const MAX_PATH_BYTES: usize = 1024;
/// Longest single path component, in bytes (the usual `NAME_MAX`).
const MAX_COMPONENT_BYTES: usize = 255;

const DIR_MODE: u32 = 0o755;
/// What a fed runtime's file is written as before it replaces the FIFO
/// (a name nothing else in the workspace has yet: that file is written
/// first).
const FED_TEMPORARY_PREFIX: &str = ".code-runner-fed-";
const FILE_MODE: u32 = 0o644;
const EXECUTABLE_MODE: u32 = 0o755;

/// Checks a bundle file path and splits it into its components: relative,
/// no `.` or `..`, no empty component (so no leading, trailing or doubled
/// `/`), no NUL byte, at most [`MAX_PATH_DEPTH`] components and
/// [`MAX_PATH_BYTES`] bytes.
pub fn validate_relative_path(path: &str) -> Result<Vec<&str>, &'static str> {
    if path.is_empty() {
        return Err("the path is empty");
    }
    if path.len() > MAX_PATH_BYTES {
        return Err("the path is too long");
    }
    if path.starts_with('/') {
        return Err("the path is absolute");
    }
    if path.contains('\0') {
        return Err("the path contains a NUL byte");
    }
    let components: Vec<&str> = path.split('/').collect();
    if components.len() > MAX_PATH_DEPTH {
        return Err("the path is too deep");
    }
    for component in &components {
        match *component {
            "" => return Err("the path has an empty component"),
            "." => return Err("the path has a `.` component"),
            ".." => return Err("the path has a `..` component"),
            name if name.len() > MAX_COMPONENT_BYTES => {
                return Err("a path component is too long");
            }
            _ => {}
        }
    }
    Ok(components)
}

/// The error of a failed `step` on `path`, for `map_err`.
fn failed(path: &str, step: &'static str) -> impl FnOnce(Errno) -> InitError {
    let path = path.to_owned();
    move |errno| InitError::WriteFile {
        path,
        step,
        source: std::io::Error::from(errno),
    }
}

/// The empty file a warm runtime holds open for its job's entry file, or
/// the FIFO it reads that file from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placeholder {
    /// A file name in the workspace.
    pub name: String,
    dev: u64,
    ino: u64,
    /// A FIFO (see [`create_fed_entry`]): replaced by the job's file.
    fifo: bool,
}

impl Placeholder {
    /// Whether `stat` is of the very file made for it.
    fn is(&self, stat: &nix::sys::stat::FileStat) -> bool {
        (stat.st_dev, stat.st_ino) == (self.dev, self.ino)
    }

    /// Whether process `pid` (of `uid`/`gid`, whose descriptors only those
    /// ids may look at) has this file open: one of its `/proc/<pid>/fd`
    /// entries is it.
    pub(crate) fn held_by(&self, pid: i32, uid: u32, gid: u32) -> Result<bool, InitError> {
        let (dev, ino) = (self.dev, self.ino);
        run_as("write-files", uid, gid, move || {
            let entries = std::fs::read_dir(format!("/proc/{pid}/fd"))
                .map_err(|source| InitError::ListDescriptors { pid, source })?;
            Ok(entries.flatten().any(|entry| {
                nix::sys::stat::stat(&entry.path())
                    .is_ok_and(|stat| (stat.st_dev, stat.st_ino) == (dev, ino))
            }))
        })
    }
}

/// Makes the empty `name` in `workspace` as `uid`/`gid` (on the thread
/// the files are written on). `name` must be one path component.
pub(crate) fn create_placeholder(
    workspace: &str,
    uid: u32,
    gid: u32,
    name: &str,
) -> Result<Placeholder, InitError> {
    one_component(name)?;
    let (workspace, name) = (workspace.to_owned(), name.to_owned());
    run_as("write-files", uid, gid, move || {
        let root = open_workspace(&workspace)?;
        let fail = |step| failed(&name, step);
        let fd = openat(
            &root,
            name.as_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(FILE_MODE),
        )
        .map_err(fail("create placeholder"))?;
        fchmod(&fd, Mode::from_bits_truncate(FILE_MODE)).map_err(fail("set mode"))?;
        let stat = fstat(&fd).map_err(fail("stat placeholder"))?;
        Ok(Placeholder {
            name,
            dev: stat.st_dev,
            ino: stat.st_ino,
            fifo: false,
        })
    })
}

/// A fed runtime's FIFO, as [`create_fed_entry`] made it.
pub(crate) struct FedEntry {
    pub placeholder: Placeholder,
    /// The supervisor's read end: the FIFO has a reader from its start, so
    /// that the write end opens without waiting and writes into it never
    /// fail before the runtime opens it. Closed once the runtime is seen
    /// holding the FIFO (`WarmRuntime`), so that a runtime that ends with
    /// its script unread fails the writes instead of leaving them waiting.
    pub reader: OwnedFd,
    /// The write end, holding `lead` already: what keeps the runtime's
    /// reads waiting for data rather than ending.
    pub writer: OwnedFd,
}

/// Makes `name` in `workspace` a FIFO as `uid`/`gid`, opens it for reading
/// and, separately, for writing without blocking (see [`FedEntry`]), and
/// writes `lead` into it, if any. `name` must be one path component.
pub(crate) fn create_fed_entry(
    workspace: &str,
    uid: u32,
    gid: u32,
    name: &str,
    lead: Option<u8>,
) -> Result<FedEntry, InitError> {
    one_component(name)?;
    let (workspace, name) = (workspace.to_owned(), name.to_owned());
    run_as("write-files", uid, gid, move || {
        let root = open_workspace(&workspace)?;
        let fail = |step| failed(&name, step);
        mkfifoat(&root, name.as_str(), Mode::from_bits_truncate(FILE_MODE))
            .map_err(fail("create fifo"))?;
        let open = |flags| {
            openat(
                &root,
                name.as_str(),
                flags | OFlag::O_NONBLOCK | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(fail("open fifo"))
        };
        // The reader first: a FIFO's write end opened without blocking
        // fails while it has no reader.
        let reader = open(OFlag::O_RDONLY)?;
        let writer = open(OFlag::O_WRONLY)?;
        let stat = fstat(&writer).map_err(fail("stat fifo"))?;
        let mut file = File::from(writer);
        file.write_all(lead.as_slice())
            .map_err(|source| InitError::WriteFile {
                path: name.clone(),
                step: "write fifo",
                source,
            })?;
        Ok(FedEntry {
            placeholder: Placeholder {
                name,
                dev: stat.st_dev,
                ino: stat.st_ino,
                fifo: true,
            },
            reader,
            writer: file.into(),
        })
    })
}

/// Checks that a warm runtime's file is one path component.
fn one_component(name: &str) -> Result<(), InitError> {
    let bad = |reason| InitError::BadPath {
        path: name.to_owned(),
        reason,
    };
    if validate_relative_path(name).map_err(bad)?.len() != 1 {
        return Err(bad(
            "a warm runtime's preopened or fed file must be a name in its cwd",
        ));
    }
    Ok(())
}

/// Removes an unused placeholder (as `uid`/`gid`), if it is still the file
/// made for it.
pub(crate) fn remove_placeholder(
    workspace: &str,
    uid: u32,
    gid: u32,
    placeholder: Placeholder,
) -> Result<(), InitError> {
    let workspace = workspace.to_owned();
    run_as("write-files", uid, gid, move || {
        let root = open_workspace(&workspace)?;
        let fail = |step| failed(&placeholder.name, step);
        let stat = fstatat(
            &root,
            placeholder.name.as_str(),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(fail("stat placeholder"))?;
        if !placeholder.is(&stat) {
            return Err(fail("check placeholder")(Errno::EEXIST));
        }
        unlinkat(&root, placeholder.name.as_str(), UnlinkatFlags::NoRemoveDir)
            .map_err(fail("remove placeholder"))
    })
}

fn open_workspace(workspace: &str) -> Result<OwnedFd, InitError> {
    Ok(OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_DIRECTORY | nix::libc::O_CLOEXEC)
        .open(workspace)
        .map_err(|source| InitError::OpenWorkspace {
            workspace: workspace.to_owned(),
            source,
        })?
        .into())
}

/// Checks every path, then writes the files under `workspace` as
/// `uid`/`gid` (see the module docs); the file named
/// by `placeholder` goes into that file. `then` runs right after, as the
/// same ids, in the same trip to the job thread.
pub(crate) fn write_bundle_files(
    workspace: &str,
    uid: u32,
    gid: u32,
    files: Vec<BundleFile>,
    placeholder: Option<Placeholder>,
    then: Option<ThenWork>,
) -> Result<(), InitError> {
    for file in &files {
        validate_relative_path(&file.path).map_err(|reason| InitError::BadPath {
            path: file.path.clone(),
            reason,
        })?;
    }
    let workspace = workspace.to_owned();
    run_as("write-files", uid, gid, move || {
        let root = open_workspace(&workspace)?;
        // The placeholder's file first (a fed runtime's is written under a
        // name of its own before it replaces the FIFO: see `write_one`).
        let (first, rest): (Vec<_>, Vec<_>) = files
            .iter()
            .partition(|file| placeholder.as_ref().is_some_and(|p| p.name == file.path));
        for file in first {
            write_one(&root, file, placeholder.as_ref())?;
        }
        for file in rest {
            write_one(&root, file, None)?;
        }
        then.map_or(Ok(()), |then| then())
    })
}

/// Work done as the same ids right after the bundle's files, on the same
/// trip to the job thread (a warm runtime's limits: see
/// `WarmRuntime::limits_work`).
pub(crate) type ThenWork = Box<dyn FnOnce() -> Result<(), InitError> + Send>;

/// Writes `files` below the directory open at `root`, as the calling
/// thread's ids (a thread already dropped to the right uid).
pub(crate) fn write_files_at(root: &OwnedFd, files: &[BundleFile]) -> Result<(), InitError> {
    for file in files {
        write_one(root, file, None)?;
    }
    Ok(())
}

fn write_one(
    root: &OwnedFd,
    file: &BundleFile,
    placeholder: Option<&Placeholder>,
) -> Result<(), InitError> {
    let fail = |step| failed(&file.path, step);
    let components = validate_relative_path(&file.path).map_err(|reason| InitError::BadPath {
        path: file.path.clone(),
        reason,
    })?;
    let Some((name, parents)) = components.split_last() else {
        return Err(InitError::BadPath {
            path: file.path.clone(),
            reason: "the path is empty",
        });
    };
    let mut parent: Option<OwnedFd> = None;
    for directory in parents {
        let at = parent.as_ref().unwrap_or(root);
        match mkdirat(at, *directory, Mode::from_bits_truncate(DIR_MODE)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(errno) => return Err(fail("create directory")(errno)),
        }
        // O_NOFOLLOW: a symlink fails with ELOOP; a file with ENOTDIR.
        let next = openat(
            at,
            *directory,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(fail("open directory"))?;
        parent = Some(next);
    }
    let mode = Mode::from_bits_truncate(if file.executable {
        EXECUTABLE_MODE
    } else {
        FILE_MODE
    });
    let at = parent.as_ref().unwrap_or(root);
    // A fed runtime's FIFO: the file is written whole under a name of its
    // own, then renamed over the FIFO (the very one made for it).
    let fifo = placeholder.filter(|placeholder| placeholder.fifo);
    let temporary = fifo.map(|_| format!("{FED_TEMPORARY_PREFIX}{name}"));
    let created = temporary.as_deref().unwrap_or(name);
    let fd = match placeholder.filter(|placeholder| !placeholder.fifo) {
        // O_EXCL: never reuse an existing file or follow an existing symlink.
        None => openat(
            at,
            created,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            mode,
        )
        .map_err(fail("create file"))?,
        // The one file made for it, and nothing else.
        Some(placeholder) => {
            let fd = openat(
                at,
                *name,
                OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(fail("open placeholder"))?;
            let stat = fstat(&fd).map_err(fail("stat placeholder"))?;
            if !placeholder.is(&stat) || stat.st_size != 0 {
                return Err(fail("check placeholder")(Errno::EEXIST));
            }
            fd
        }
    };
    // The exact mode, whatever the umask.
    fchmod(&fd, mode).map_err(fail("set mode"))?;
    File::from(fd)
        .write_all(&file.content)
        .map_err(|source| InitError::WriteFile {
            path: file.path.clone(),
            step: "write",
            source,
        })?;
    if let (Some(fifo), Some(temporary)) = (fifo, &temporary) {
        let stat = fstatat(at, *name, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(fail("stat fifo"))?;
        if !fifo.is(&stat) {
            return Err(fail("check fifo")(Errno::EEXIST));
        }
        renameat(at, temporary.as_str(), at, *name).map_err(fail("replace fifo"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepts_plain_relative_paths() {
        assert_eq!(validate_relative_path("main.py"), Ok(vec!["main.py"]));
        assert_eq!(
            validate_relative_path("src/lib/a.rs"),
            Ok(vec!["src", "lib", "a.rs"])
        );
        assert_eq!(validate_relative_path("..a/b.."), Ok(vec!["..a", "b.."]));
    }

    #[test]
    fn refuses_escapes_and_odd_shapes() {
        for path in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a/./b",
            ".",
            "a//b",
            "a/",
            "a\0b",
        ] {
            assert!(validate_relative_path(path).is_err(), "{path:?} accepted");
        }
        let deep = vec!["d"; MAX_PATH_DEPTH + 1].join("/");
        assert_eq!(validate_relative_path(&deep), Err("the path is too deep"));
        let long = "x".repeat(MAX_COMPONENT_BYTES + 1);
        assert_eq!(
            validate_relative_path(&long),
            Err("a path component is too long")
        );
    }

    proptest! {
        #[test]
        fn accepted_paths_stay_below_the_workspace(path in "[a-z./]{0,40}") {
            if let Ok(components) = validate_relative_path(&path) {
                prop_assert!(!path.starts_with('/'));
                prop_assert!(components.iter().all(|c| !c.is_empty() && *c != "." && *c != ".."));
                prop_assert_eq!(components.join("/"), path);
            }
        }
    }
}
