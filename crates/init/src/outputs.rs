//! A stage's output files ([`OutputRequest`]): after the stage ended and
//! every process of its uid is gone, each pattern is matched below the
//! stage's `cwd` and answered, before the stage's `stage_end`.
//!
//! The work is done as the stage's uid (on the job thread, or a thread of
//! its own for a graded job's runs: [`super::job_thread::run_as`]), so it
//! reads nothing the program could not have read. Nothing follows a
//! symbolic link: a literal path is checked component by component with
//! `lstat`, the walk of a glob never enters a linked directory, and every
//! file is opened `O_NOFOLLOW`; a link that is named or matched is
//! answered `not_regular_file`, never read. No process of the job runs
//! meanwhile, so nothing changes under the walk.
//!
//! The bytes go straight from the file to the frame writer in chunks of
//! [`MAX_OUTPUT_CHUNK`] (the writer's queue is bounded), so collecting holds
//! no file in memory. The request's caps bound what is sent; the walk of a
//! glob is bounded too ([`MAX_WALK_ENTRIES`]), so a program that made a
//! million files costs a bounded time.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use code_runner_protocol::{
    MAX_OUTPUT_CHUNK, OutputError, OutputFile, OutputRequest, SandboxMessage,
};
use glob::{MatchOptions, Pattern};

use super::InitError;

/// Most directory entries one glob's walk looks at.
pub const MAX_WALK_ENTRIES: usize = 10_000;
/// Deepest a glob's walk goes below `cwd`.
const MAX_WALK_DEPTH: usize = 32;

/// How every pattern matches: `*` and `?` never cross a `/` (`**` does),
/// hidden files match like any other, case counts.
pub const MATCH: MatchOptions = MatchOptions {
    case_sensitive: true,
    require_literal_separator: true,
    require_literal_leading_dot: false,
};

/// Whether `pattern` is a glob rather than one path.
pub fn is_glob(pattern: &str) -> bool {
    pattern.contains(['*', '?', '['])
}

/// Where a send goes: the frame writer, or a test's list.
pub(crate) type Send<'a> = dyn FnMut(SandboxMessage) -> Result<(), InitError> + 'a;

/// A file found for a pattern, not opened yet.
struct Found {
    pattern: String,
    name: String,
}

/// What is left of the request's caps.
struct Room {
    /// Answers naming a file (sent or not) still allowed.
    files: u32,
    bytes: u64,
    max_bytes: u64,
}

/// Answers every pattern of `request` below `cwd` through `send`.
pub(crate) fn collect(
    cwd: &Path,
    request: &OutputRequest,
    send: &mut Send,
) -> Result<(), InitError> {
    let mut room = Room {
        files: request.max_files,
        bytes: request.max_bytes,
        max_bytes: request.max_bytes,
    };
    let mut seen = HashSet::new();
    for pattern in &request.patterns {
        let mut errors = Vec::new();
        let found = if is_glob(pattern) {
            matches(cwd, pattern, &mut errors)
        } else {
            literal(cwd, pattern, &mut errors)
        };
        if found.is_empty() && errors.is_empty() {
            errors.push(error(pattern, None, "not_found", not_found(pattern)));
        }
        // Each answer naming a file counts against the request's files, so
        // a program that made ten thousand links gets one line, not ten
        // thousand.
        let mut over = false;
        for error in errors {
            if error.name.is_some() {
                if room.files == 0 {
                    over = true;
                    continue;
                }
                room.files -= 1;
            }
            send(SandboxMessage::OutputError(error))?;
        }
        for found in found {
            if !seen.insert(found.name.clone()) {
                continue;
            }
            if room.files == 0 {
                over = true;
                continue;
            }
            room.files -= 1;
            send_file(cwd, &found, &mut room, send)?;
        }
        if over {
            send(SandboxMessage::OutputError(error(
                pattern,
                None,
                "cap_reached",
                format!(
                    "more files matched {pattern:?} than the {} a stage's outputs answer; the rest are not listed",
                    request.max_files
                ),
            )))?;
        }
    }
    Ok(())
}

fn not_found(pattern: &str) -> String {
    if is_glob(pattern) {
        format!("nothing below the working directory matches {pattern:?}")
    } else {
        format!("{pattern:?} does not exist in the working directory")
    }
}

fn error(pattern: &str, name: Option<&str>, code: &str, message: String) -> OutputError {
    OutputError {
        pattern: pattern.to_string(),
        name: name.map(str::to_string),
        error: code.to_string(),
        message,
    }
}

/// What a non-regular entry is, in words.
fn kind_of(file_type: std::fs::FileType) -> &'static str {
    if file_type.is_symlink() {
        "a symbolic link (links are not followed)"
    } else if file_type.is_dir() {
        "a directory"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_socket() {
        "a socket"
    } else {
        "a device"
    }
}

/// One path: every directory on the way a real one (no link), the last
/// component a regular file.
fn literal(cwd: &Path, pattern: &str, errors: &mut Vec<OutputError>) -> Vec<Found> {
    let mut path = cwd.to_path_buf();
    let components: Vec<&str> = pattern.split('/').filter(|c| !c.is_empty()).collect();
    for (at, component) in components.iter().enumerate() {
        path.push(component);
        let last = at + 1 == components.len();
        let metadata = match std::fs::symlink_metadata(&path) {
            Ok(metadata) => metadata,
            Err(_) => return Vec::new(),
        };
        let file_type = metadata.file_type();
        if last && file_type.is_file() {
            return vec![Found {
                pattern: pattern.to_string(),
                name: components.join("/"),
            }];
        }
        if !last && file_type.is_dir() {
            continue;
        }
        let what = components[..=at].join("/");
        errors.push(error(
            pattern,
            Some(&components.join("/")),
            "not_regular_file",
            format!(
                "{what:?} is {}; only regular files are returned",
                kind_of(file_type)
            ),
        ));
        return Vec::new();
    }
    Vec::new()
}

/// The directory a glob's walk starts from: its components before the
/// first one with a wildcard.
fn walk_base(pattern: &str) -> (PathBuf, usize) {
    let mut base = PathBuf::new();
    let mut depth = 0;
    let components: Vec<&str> = pattern.split('/').collect();
    for component in &components[..components.len().saturating_sub(1)] {
        if is_glob(component) {
            break;
        }
        base.push(component);
        depth += 1;
    }
    (base, depth)
}

/// The regular files below `cwd` that `pattern` matches, in name order;
/// a link or special file it matches is an error (a directory it matches
/// is walked into, not answered).
fn matches(cwd: &Path, pattern: &str, errors: &mut Vec<OutputError>) -> Vec<Found> {
    let Ok(glob) = Pattern::new(pattern) else {
        errors.push(error(
            pattern,
            None,
            "invalid_pattern",
            format!("{pattern:?} is not a valid glob"),
        ));
        return Vec::new();
    };
    let (base, base_depth) = walk_base(pattern);
    let mut found = Vec::new();
    let mut visited = 0usize;
    // (relative directory, depth)
    let mut stack = vec![(base, base_depth)];
    while let Some((dir, depth)) = stack.pop() {
        // Only a real directory is walked into (`lstat`, then the listing).
        let is_dir = std::fs::symlink_metadata(cwd.join(&dir)).is_ok_and(|m| m.is_dir());
        if !is_dir {
            continue;
        }
        let Ok(listing) = std::fs::read_dir(cwd.join(&dir)) else {
            continue;
        };
        let mut entries = Vec::new();
        for entry in listing.flatten() {
            visited += 1;
            if visited > MAX_WALK_ENTRIES {
                errors.push(error(
                    pattern,
                    None,
                    "cap_reached",
                    format!(
                        "the walk for {pattern:?} stopped after {MAX_WALK_ENTRIES} entries; files past them were not looked at"
                    ),
                ));
                stack.clear();
                break;
            }
            let Ok(file_type) = entry.file_type() else {
                continue;
            };
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            entries.push((dir.join(name), file_type));
        }
        entries.sort_by(|a, b| b.0.cmp(&a.0));
        for (path, file_type) in entries {
            let Some(relative) = path.to_str() else {
                continue;
            };
            if file_type.is_dir() {
                if depth < MAX_WALK_DEPTH {
                    stack.push((path.clone(), depth + 1));
                }
                continue;
            }
            if !glob.matches_with(relative, MATCH) {
                continue;
            }
            if file_type.is_file() {
                found.push(Found {
                    pattern: pattern.to_string(),
                    name: relative.to_string(),
                });
            } else {
                errors.push(error(
                    pattern,
                    Some(relative),
                    "not_regular_file",
                    format!(
                        "{relative:?} is {}; only regular files are returned",
                        kind_of(file_type)
                    ),
                ));
            }
        }
    }
    found.sort_by(|a, b| a.name.cmp(&b.name));
    errors.sort_by(|a, b| a.name.cmp(&b.name));
    found
}

/// Sends one file, or why not.
fn send_file(cwd: &Path, found: &Found, room: &mut Room, send: &mut Send) -> Result<(), InitError> {
    let Found { pattern, name } = found;
    let refuse = |code: &str, message: String| {
        SandboxMessage::OutputError(error(pattern, Some(name), code, message))
    };
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits() | nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(cwd.join(name));
    let (mut file, size) = match file.and_then(|f| f.metadata().map(|m| (f, m))) {
        Ok((file, metadata)) if metadata.is_file() => (file, metadata.len()),
        Ok((_, metadata)) => {
            return send(refuse(
                "not_regular_file",
                format!(
                    "{name:?} is {}; only regular files are returned",
                    kind_of(metadata.file_type())
                ),
            ));
        }
        Err(io) => {
            return send(refuse(
                "unreadable",
                format!("{name:?} cannot be read: {io}"),
            ));
        }
    };
    if size > room.max_bytes {
        return send(refuse(
            "too_large",
            format!(
                "{name:?} has {size} bytes, more than the {} a stage's outputs may hold",
                room.max_bytes
            ),
        ));
    }
    if size > room.bytes {
        return send(refuse(
            "cap_reached",
            format!(
                "{name:?} has {size} bytes; the stage's outputs have {} bytes of their {} left",
                room.bytes, room.max_bytes
            ),
        ));
    }
    room.bytes -= size;
    send(SandboxMessage::OutputFile(OutputFile {
        name: name.clone(),
        size,
    }))?;
    send_bytes(&mut file, name, size, send)
}

/// Exactly `size` bytes of `file` in `output_data` frames. The file cannot
/// change (no process of the job is left); should it be shorter than it
/// was, the rest is zeros, and the supervisor says so on stderr.
fn send_bytes(file: &mut File, name: &str, size: u64, send: &mut Send) -> Result<(), InitError> {
    let mut left = size;
    let mut buffer = vec![0u8; MAX_OUTPUT_CHUNK];
    while left > 0 {
        let want = usize::try_from(left)
            .unwrap_or(usize::MAX)
            .min(MAX_OUTPUT_CHUNK);
        let read = match file.read(&mut buffer[..want]) {
            Ok(0) | Err(_) => {
                eprintln!(
                    "code-runner-init: output file {name:?} ended early; sending zeros for the rest"
                );
                buffer[..want].fill(0);
                want
            }
            Ok(read) => read,
        };
        send(SandboxMessage::OutputData(buffer[..read].to_vec()))?;
        left -= read as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn request(patterns: &[&str], max_files: u32, max_bytes: u64) -> OutputRequest {
        OutputRequest {
            patterns: patterns.iter().map(|p| p.to_string()).collect(),
            max_files,
            max_bytes,
        }
    }

    /// The frames collected, as (file name, bytes) and errors.
    fn run(cwd: &Path, request: &OutputRequest) -> (Vec<(String, Vec<u8>)>, Vec<OutputError>) {
        let mut frames = Vec::new();
        collect(cwd, request, &mut |frame| {
            frames.push(frame);
            Ok(())
        })
        .unwrap();
        let (mut files, mut errors) = (Vec::<(String, Vec<u8>)>::new(), Vec::new());
        for frame in frames {
            match frame {
                SandboxMessage::OutputFile(file) => files.push((file.name, Vec::new())),
                SandboxMessage::OutputData(data) => files.last_mut().unwrap().1.extend(data),
                SandboxMessage::OutputError(error) => errors.push(error),
                other => panic!("unexpected {other:?}"),
            }
        }
        (files, errors)
    }

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("out/sub")).unwrap();
        std::fs::write(root.join("out/a.png"), [0u8, 255, 1]).unwrap();
        std::fs::write(root.join("out/b.png"), b"bb").unwrap();
        std::fs::write(root.join("out/c.txt"), b"c").unwrap();
        std::fs::write(root.join("out/sub/d.png"), b"d").unwrap();
        std::fs::write(root.join("result.csv"), b"x,y\n").unwrap();
        symlink("/etc/passwd", root.join("out/e.png")).unwrap();
        symlink("/etc", root.join("etc")).unwrap();
        dir
    }

    #[test]
    fn a_glob_sends_its_regular_files_in_name_order_and_names_a_link() {
        let dir = tree();
        let (files, errors) = run(
            dir.path(),
            &request(&["out/*.png", "result.csv"], 100, 1 << 20),
        );
        assert_eq!(
            files,
            vec![
                ("out/a.png".to_string(), vec![0, 255, 1]),
                ("out/b.png".to_string(), b"bb".to_vec()),
                ("result.csv".to_string(), b"x,y\n".to_vec()),
            ]
        );
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].name.as_deref(), Some("out/e.png"));
        assert_eq!(errors[0].error, "not_regular_file");
        let (files, _) = run(dir.path(), &request(&["**/*.png"], 100, 1 << 20));
        let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["out/a.png", "out/b.png", "out/sub/d.png"]);
    }

    #[test]
    fn links_directories_and_missing_paths_are_answered_not_read() {
        let dir = tree();
        let (files, errors) = run(
            dir.path(),
            &request(
                &["missing.txt", "out", "etc/passwd", "out/e.png", "nothing/*"],
                100,
                1 << 20,
            ),
        );
        assert!(files.is_empty());
        let codes: Vec<(&str, &str)> = errors
            .iter()
            .map(|e| (e.pattern.as_str(), e.error.as_str()))
            .collect();
        assert_eq!(
            codes,
            [
                ("missing.txt", "not_found"),
                ("out", "not_regular_file"),
                ("etc/passwd", "not_regular_file"),
                ("out/e.png", "not_regular_file"),
                ("nothing/*", "not_found"),
            ]
        );
    }

    #[test]
    fn the_caps_say_what_did_not_fit_and_a_file_is_sent_once() {
        let dir = tree();
        let (files, errors) = run(
            dir.path(),
            &request(&["out/a.png", "out/*.png"], 1, 1 << 20),
        );
        assert_eq!(files, vec![("out/a.png".to_string(), vec![0, 255, 1])]);
        // One answer for what did not fit: the link and b.png are not named.
        let codes: Vec<(&str, Option<&str>, &str)> = errors
            .iter()
            .map(|e| (e.pattern.as_str(), e.name.as_deref(), e.error.as_str()))
            .collect();
        assert_eq!(codes, [("out/*.png", None, "cap_reached")]);
        let (files, errors) = run(dir.path(), &request(&["out/*.png"], 100, 4));
        assert_eq!(files.len(), 1);
        assert_eq!(errors[1].name.as_deref(), Some("out/b.png"));
        assert_eq!(errors[1].error, "cap_reached");
        let (_, errors) = run(dir.path(), &request(&["result.csv"], 100, 2));
        assert_eq!(errors[0].error, "too_large");
    }

    #[test]
    fn a_large_file_goes_in_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let content: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join("big.bin"), &content).unwrap();
        let mut chunks = 0;
        collect(
            dir.path(),
            &request(&["big.bin"], 1, 1 << 20),
            &mut |frame| {
                if let SandboxMessage::OutputData(data) = frame {
                    assert!(data.len() <= MAX_OUTPUT_CHUNK);
                    chunks += 1;
                }
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(chunks, 4);
        let (files, _) = run(dir.path(), &request(&["big.bin"], 1, 1 << 20));
        assert_eq!(files[0].1, content);
    }
}
