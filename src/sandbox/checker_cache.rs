//! Compiled checker programs, kept by the worker for the next graded job
//! with the same checker: a class's 300 submissions judged by one C++
//! checker compile it once per worker, not 300 times.
//!
//! An entry is what the checker's `/workspace` held once its compile stage
//! succeeded (read back from its sandbox as a tar archive, see
//! [`files_of_archive`]); a later checker with the same key starts with
//! those files and no compile stage. The key ([`CacheKey`]) covers the
//! tenant (the job's API key: tenants never share an entry, so no tenant
//! can tell from the timing what another one's checker is), the language,
//! its version, the id of the image the checker's container runs (a
//! rebuilt image compiles again), the compile command and environment, and
//! every file of the checker.
//!
//! At most one compile per key is under way at a time ([`Lookup::Lead`]):
//! checkers that ask meanwhile wait for it ([`Lookup::Wait`]) and take its
//! entry; when it fails (the checker did not compile, its sandbox failed or
//! its job ended first), one of them compiles in turn. A failed compile is
//! never kept. Entries go least recently used first once their bytes pass
//! the cache's size; an entry larger than [`MAX_ENTRY_BYTES`] (or than the
//! whole cache) is not kept.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::protocol::{BundleFile, StageSpec};

/// Largest entry kept: the archive read back from the sandbox, and the
/// files sent into the next one (their JSON frame stays well under the
/// protocol's largest host frame).
pub const MAX_ENTRY_BYTES: u64 = 32 * 1024 * 1024;

/// What identifies a compiled checker: see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheKey([u8; 32]);

impl CacheKey {
    /// The key of a checker of `tenant` (`""`: a job with no API key, run
    /// by the engine alone) compiled by `compile` in `image` (an image id) from `files`.
    pub fn new(
        tenant: &str,
        language: &str,
        version: &str,
        image: &str,
        compile: &StageSpec,
        files: &[BundleFile],
    ) -> Self {
        let mut hash = Sha256::new();
        // Every part is length-prefixed: no two different keys' parts
        // concatenate to the same bytes.
        let mut part = |bytes: &[u8]| {
            hash.update((bytes.len() as u64).to_le_bytes());
            hash.update(bytes);
        };
        part(b"code-runner checker cache 1");
        part(tenant.as_bytes());
        part(language.as_bytes());
        part(version.as_bytes());
        part(image.as_bytes());
        part(&(compile.argv.len() as u64).to_le_bytes());
        for arg in &compile.argv {
            part(arg.as_bytes());
        }
        part(&(compile.env.len() as u64).to_le_bytes());
        for (name, value) in &compile.env {
            part(name.as_bytes());
            part(value.as_bytes());
        }
        part(&(files.len() as u64).to_le_bytes());
        for file in files {
            part(file.path.as_bytes());
            part(&file.content);
            part(&[u8::from(file.executable)]);
        }
        Self(hash.finalize().into())
    }
}

/// The worker's compiled checkers (shared by clones).
#[derive(Debug, Clone)]
pub struct CheckerCache {
    state: Arc<Mutex<State>>,
    limit_bytes: u64,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<CacheKey, Entry>,
    /// Bytes of every ready entry.
    bytes: u64,
    /// Counts lookups: an entry's `used` is the count at its last use.
    clock: u64,
}

#[derive(Debug)]
enum Entry {
    /// A compile under way; its lead's sender is dropped when it ends.
    Compiling(watch::Receiver<()>),
    Ready {
        files: Arc<[BundleFile]>,
        bytes: u64,
        used: u64,
    },
}

/// What a checker about to compile does.
#[derive(Debug)]
pub enum Lookup {
    /// Start with these files, without the compile stage.
    Hit(Arc<[BundleFile]>),
    /// Compile, then [`Lead::keep`] the result (dropping the lead without
    /// it lets the next checker of the key compile).
    Lead(Lead),
    /// Another checker compiles it: wait ([`Wait::done`]), then look again.
    Wait(Wait),
    /// The cache is off: compile, keep nothing.
    Off,
}

/// The one compile under way for a key.
#[derive(Debug)]
pub struct Lead {
    cache: CheckerCache,
    key: CacheKey,
    _done: watch::Sender<()>,
    kept: bool,
}

/// A wait for another checker's compile of the same key.
#[derive(Debug)]
pub struct Wait(watch::Receiver<()>);

impl Wait {
    /// Returns when the compile it waits for has ended, kept or not.
    pub async fn done(mut self) {
        // Nothing is ever sent: the only news is the sender's drop.
        while self.0.changed().await.is_ok() {}
    }
}

impl CheckerCache {
    /// A cache of at most `limit_bytes` of compiled checkers; 0: off.
    pub fn new(limit_bytes: u64) -> Self {
        Self {
            state: Arc::default(),
            limit_bytes,
        }
    }

    /// Most bytes kept (0: the cache is off).
    pub fn limit_bytes(&self) -> u64 {
        self.limit_bytes
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What a checker of `key` does: see [`Lookup`].
    pub fn lookup(&self, key: CacheKey) -> Lookup {
        if self.limit_bytes == 0 {
            return Lookup::Off;
        }
        let mut state = self.state();
        state.clock += 1;
        let clock = state.clock;
        match state.entries.get_mut(&key) {
            Some(Entry::Ready { files, used, .. }) => {
                *used = clock;
                Lookup::Hit(files.clone())
            }
            Some(Entry::Compiling(receiver)) => Lookup::Wait(Wait(receiver.clone())),
            None => {
                let (done, receiver) = watch::channel(());
                state.entries.insert(key, Entry::Compiling(receiver));
                Lookup::Lead(Lead {
                    cache: self.clone(),
                    key,
                    _done: done,
                    kept: false,
                })
            }
        }
    }

    /// Ready entries and their bytes (for tests).
    pub fn usage(&self) -> (usize, u64) {
        let state = self.state();
        let ready = state
            .entries
            .values()
            .filter(|entry| matches!(entry, Entry::Ready { .. }))
            .count();
        (ready, state.bytes)
    }
}

impl Lead {
    /// Keeps `files` as the key's entry (unless they are too large), making
    /// room by dropping the least recently used entries; the checkers
    /// waiting for this compile take it.
    pub fn keep(mut self, files: Vec<BundleFile>) {
        let bytes: u64 = files
            .iter()
            .map(|file| file.content.len() as u64 + file.path.len() as u64)
            .sum();
        let limit = self.cache.limit_bytes.min(MAX_ENTRY_BYTES);
        if bytes > limit {
            tracing::info!(
                bytes,
                limit,
                "a compiled checker is larger than the cache keeps"
            );
            return;
        }
        let cache = self.cache.clone();
        let mut state = cache.state();
        while state.bytes + bytes > cache.limit_bytes {
            let oldest = state
                .entries
                .iter()
                .filter_map(|(key, entry)| match entry {
                    Entry::Ready { used, .. } => Some((*used, *key)),
                    Entry::Compiling(_) => None,
                })
                .min_by_key(|(used, _)| *used);
            let Some((_, key)) = oldest else { break };
            if let Some(Entry::Ready { bytes, .. }) = state.entries.remove(&key) {
                state.bytes -= bytes;
            }
        }
        let used = state.clock;
        state.bytes += bytes;
        state.entries.insert(
            self.key,
            Entry::Ready {
                files: files.into(),
                bytes,
                used,
            },
        );
        self.kept = true;
    }
}

impl Drop for Lead {
    fn drop(&mut self) {
        if !self.kept {
            let mut state = self.cache.state();
            if matches!(state.entries.get(&self.key), Some(Entry::Compiling(_))) {
                state.entries.remove(&self.key);
            }
        }
        // `_done` drops after this: the waiters look again and find the
        // entry, or none (and one of them leads).
    }
}

/// The files of a tar archive of the checker's `/workspace` (read back
/// after its compile), as bundle files; `Err` names why it cannot be kept
/// (an entry that is neither a regular file nor a directory, a path that
/// cannot be a bundle file's, a damaged archive).
pub fn files_of_archive(archive: &[u8]) -> Result<Vec<BundleFile>, String> {
    use std::io::Read;
    let mut files = Vec::new();
    let mut reader = tar::Archive::new(archive);
    let entries = reader
        .entries()
        .map_err(|e| format!("unreadable archive: {e}"))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| format!("unreadable archive entry: {e}"))?;
        let path = entry
            .path()
            .map_err(|e| format!("unreadable path in the archive: {e}"))?
            .to_string_lossy()
            .into_owned();
        let path = path
            .trim_start_matches("./")
            .trim_end_matches('/')
            .to_string();
        let kind = entry.header().entry_type();
        if kind.is_dir() {
            continue;
        }
        if !kind.is_file() {
            return Err(format!("{path:?} is not a regular file ({kind:?})"));
        }
        if path.is_empty()
            || path
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == "..")
        {
            return Err(format!("{path:?} cannot be a bundle file's path"));
        }
        let mode = entry
            .header()
            .mode()
            .map_err(|e| format!("unreadable mode of {path:?}: {e}"))?;
        let mut content = Vec::new();
        entry
            .read_to_end(&mut content)
            .map_err(|e| format!("unreadable content of {path:?}: {e}"))?;
        files.push(BundleFile {
            path,
            content,
            executable: mode & 0o111 != 0,
        });
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(argv: &[&str]) -> StageSpec {
        StageSpec {
            name: "compile".into(),
            argv: argv.iter().map(|a| a.to_string()).collect(),
            env: vec![("PATH".into(), "/usr/bin".into())],
            cwd: "/workspace".into(),
            stdin: false,
            watch_input: false,
            limits: crate::protocol::StageLimits {
                wall_ms: 2000,
                idle_ms: None,
                cpu_ms: 1000,
                output_bytes: 1,
                fsize_bytes: 1,
                nofile: 1,
                nproc: None,
                cpu_quota_millis: None,
                address_space_bytes: None,
            },
            outputs: None,
        }
    }

    fn file(path: &str, content: &[u8]) -> BundleFile {
        BundleFile {
            path: path.into(),
            content: content.to_vec(),
            executable: false,
        }
    }

    fn key(tenant: &str, files: &[BundleFile]) -> CacheKey {
        CacheKey::new(
            tenant,
            "cpp",
            "12",
            "code-runner/cpp:latest",
            &stage(&["g++"]),
            files,
        )
    }

    #[test]
    fn the_key_covers_the_tenant_the_command_and_every_file() {
        let files = [file("check.cpp", b"int main(){}")];
        let base = key("a", &files);
        assert_eq!(base, key("a", &files));
        assert_ne!(base, key("b", &files));
        assert_ne!(base, key("a", &[file("check.cpp", b"int main(){ }")]));
        assert_ne!(base, key("a", &[file("check.cc", b"int main(){}")]));
        let mut executable = file("check.cpp", b"int main(){}");
        executable.executable = true;
        assert_ne!(base, key("a", &[executable]));
        assert_ne!(
            base,
            CacheKey::new(
                "a",
                "cpp",
                "12",
                "code-runner/cpp:latest",
                &stage(&["g++", "-O2"]),
                &files
            )
        );
        assert_ne!(
            base,
            CacheKey::new(
                "a",
                "cpp",
                "12",
                "code-runner/cpp:next",
                &stage(&["g++"]),
                &files
            )
        );
        // Parts are delimited: moving bytes between two parts changes it.
        assert_ne!(
            CacheKey::new("ab", "c", "", "", &stage(&[]), &[]),
            CacheKey::new("a", "bc", "", "", &stage(&[]), &[])
        );
    }

    /// The first lookup of `k` (it leads) and a second one (it waits).
    fn lead_and_wait(cache: &CheckerCache, k: CacheKey) -> (Lead, Wait) {
        let Lookup::Lead(lead) = cache.lookup(k) else {
            panic!("the first lookup leads");
        };
        let Lookup::Wait(wait) = cache.lookup(k) else {
            panic!("a second lookup waits");
        };
        (lead, wait)
    }

    #[tokio::test]
    async fn one_compile_per_key_and_the_waiters_take_its_entry() {
        let cache = CheckerCache::new(1024);
        let k = key("a", &[]);
        let (lead, wait) = lead_and_wait(&cache, k);
        let waiter = tokio::spawn(wait.done());
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        lead.keep(vec![file("main", b"binary")]);
        waiter.await.unwrap();
        let Lookup::Hit(files) = cache.lookup(k) else {
            panic!("the entry is kept");
        };
        assert_eq!(&*files, &[file("main", b"binary")]);
        assert_eq!(cache.usage(), (1, 10));
    }

    #[tokio::test]
    async fn a_compile_that_is_not_kept_lets_the_next_one_lead() {
        let cache = CheckerCache::new(1024);
        let k = key("a", &[]);
        let (lead, wait) = lead_and_wait(&cache, k);
        drop(lead);
        wait.done().await;
        assert!(matches!(cache.lookup(k), Lookup::Lead(_)));
        assert_eq!(cache.usage(), (0, 0));
    }

    #[test]
    fn the_least_recently_used_entries_go_first_and_a_too_large_one_is_not_kept() {
        let cache = CheckerCache::new(100);
        let keep = |tenant: &str, size: usize| {
            let Lookup::Lead(lead) = cache.lookup(key(tenant, &[])) else {
                panic!("{tenant} leads");
            };
            lead.keep(vec![file("m", &vec![0; size - 1])]);
        };
        keep("a", 40);
        keep("b", 40);
        assert!(matches!(cache.lookup(key("a", &[])), Lookup::Hit(_)));
        // 40 + 40 + 40 > 100: b, used least recently, goes.
        keep("c", 40);
        assert!(matches!(cache.lookup(key("a", &[])), Lookup::Hit(_)));
        assert!(matches!(cache.lookup(key("c", &[])), Lookup::Hit(_)));
        assert!(matches!(cache.lookup(key("b", &[])), Lookup::Lead(_)));
        assert_eq!(cache.usage(), (2, 80));
        // Larger than the whole cache: not kept, and nothing else goes.
        keep("d", 101);
        assert!(matches!(cache.lookup(key("d", &[])), Lookup::Lead(_)));
        assert_eq!(cache.usage(), (2, 80));
    }

    #[test]
    fn an_off_cache_keeps_nothing() {
        let cache = CheckerCache::new(0);
        assert!(matches!(cache.lookup(key("a", &[])), Lookup::Off));
    }

    fn archive(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        build(&mut builder);
        builder.into_inner().unwrap()
    }

    fn append(
        builder: &mut tar::Builder<Vec<u8>>,
        path: &str,
        kind: tar::EntryType,
        mode: u32,
        content: &[u8],
    ) {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_size(content.len() as u64);
        if kind.is_symlink() {
            header.set_link_name("main").unwrap();
        }
        header.set_cksum();
        builder.append_data(&mut header, path, content).unwrap();
    }

    #[test]
    fn an_archive_becomes_bundle_files_with_their_executable_bit() {
        let bytes = archive(|b| {
            append(b, "./", tar::EntryType::Directory, 0o755, b"");
            append(b, "./main", tar::EntryType::Regular, 0o755, b"\x7fELF");
            append(
                b,
                "./check.cpp",
                tar::EntryType::Regular,
                0o644,
                b"int main(){}",
            );
            append(b, "./pkg/", tar::EntryType::Directory, 0o755, b"");
            append(
                b,
                "./pkg/A.class",
                tar::EntryType::Regular,
                0o644,
                b"\xca\xfe",
            );
        });
        let files = files_of_archive(&bytes).unwrap();
        assert_eq!(
            files,
            [
                BundleFile {
                    path: "main".into(),
                    content: b"\x7fELF".to_vec(),
                    executable: true
                },
                file("check.cpp", b"int main(){}"),
                file("pkg/A.class", b"\xca\xfe"),
            ]
        );
    }

    #[test]
    fn an_archive_with_a_link_is_not_kept() {
        let bytes = archive(|b| {
            append(b, "./main", tar::EntryType::Regular, 0o755, b"x");
            append(b, "./alias", tar::EntryType::Symlink, 0o777, b"");
        });
        assert_eq!(
            files_of_archive(&bytes).unwrap_err(),
            "\"alias\" is not a regular file (Symlink)"
        );
        assert!(
            files_of_archive(
                b"not an archive at all, but long enough to look at"
                    .repeat(20)
                    .as_slice()
            )
            .is_err()
        );
    }
}
