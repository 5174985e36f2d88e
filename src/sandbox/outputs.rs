//! The session's side of a stage's output files: what the supervisor sends
//! between a stage's output and its end (`output_file` and its bytes,
//! `output_error`), checked against what the stage asked for and bounded
//! whatever the sandbox claims. A frame that breaks the rules (a file over
//! the request's caps, bytes past the size announced, a name that is not a
//! relative path, a pattern the job did not give) ends the job as `error`,
//! as every malformed frame does; a file that fits the request but not the
//! job's room left ([`crate::job::outputs::MAX_BYTES`] for all its stages
//! and tests together) is read past and answered `cap_reached`, so a
//! graded job's tests cannot together hold more than that in memory.

use crate::job::check_file_name;
use crate::job::outputs::OutputEntry;
use crate::protocol::{OutputError, OutputFile, OutputRequest};

/// Longest `message` kept from the sandbox, in characters.
const MESSAGE_CHARS: usize = 300;
/// Longest `error` code from the sandbox.
const CODE_BYTES: usize = 32;

/// A file whose bytes are coming.
struct InFlight {
    name: String,
    left: u64,
    /// `None`: over the job's room, its bytes are dropped.
    data: Option<Vec<u8>>,
    size: u64,
}

/// The output files of the stage or test that is running.
pub(super) struct OutputCollector {
    request: OutputRequest,
    /// Bytes of the job's room still free for this stage.
    room: u64,
    announced_files: u32,
    announced_bytes: u64,
    entries: Vec<OutputEntry>,
    file: Option<InFlight>,
}

impl OutputCollector {
    /// For a stage that asked `request`, with `room` bytes of the job's
    /// outputs left.
    pub(super) fn new(request: OutputRequest, room: u64) -> Self {
        Self {
            request,
            room,
            announced_files: 0,
            announced_bytes: 0,
            entries: Vec::new(),
            file: None,
        }
    }

    /// Most entries a compliant supervisor sends: one per file it may
    /// answer, and per pattern a `not_found` or a stopped walk and one
    /// `cap_reached`.
    fn max_entries(&self) -> usize {
        self.request.max_files as usize + 3 * self.request.patterns.len()
    }

    fn has_room_for_entry(&self) -> Result<(), String> {
        if self.entries.len() >= self.max_entries() {
            return Err(format!(
                "the sandbox sent more than {} output entries",
                self.max_entries()
            ));
        }
        Ok(())
    }

    pub(super) fn on_file(&mut self, file: OutputFile) -> Result<(), String> {
        if let Some(open) = &self.file {
            return Err(format!(
                "the sandbox started output file {:?} before {:?} was whole",
                file.name, open.name
            ));
        }
        check_file_name(&file.name).map_err(|problem| {
            format!("the sandbox sent an output file with a bad name: {problem}")
        })?;
        self.has_room_for_entry()?;
        self.announced_files += 1;
        self.announced_bytes = self.announced_bytes.saturating_add(file.size);
        if self.announced_files > self.request.max_files
            || self.announced_bytes > self.request.max_bytes
        {
            return Err(format!(
                "the sandbox sent output files over the caps asked ({} files, {} bytes)",
                self.request.max_files, self.request.max_bytes
            ));
        }
        let data = (file.size <= self.room).then(|| {
            self.room -= file.size;
            Vec::with_capacity(usize::try_from(file.size.min(1 << 20)).unwrap_or(0))
        });
        self.file = Some(InFlight {
            name: file.name,
            left: file.size,
            data,
            size: file.size,
        });
        self.complete_if_whole();
        Ok(())
    }

    pub(super) fn on_data(&mut self, bytes: Vec<u8>) -> Result<(), String> {
        let Some(file) = &mut self.file else {
            return Err(format!(
                "the sandbox sent {} bytes of an output file it never announced",
                bytes.len()
            ));
        };
        let len = bytes.len() as u64;
        if len > file.left {
            return Err(format!(
                "the sandbox sent more bytes of output file {:?} than its size",
                file.name
            ));
        }
        file.left -= len;
        if let Some(data) = &mut file.data {
            data.extend_from_slice(&bytes);
        }
        self.complete_if_whole();
        Ok(())
    }

    fn complete_if_whole(&mut self) {
        if self.file.as_ref().is_some_and(|f| f.left == 0)
            && let Some(file) = self.file.take()
        {
            self.entries.push(match file.data {
                Some(data) => OutputEntry::inline(file.name, data),
                None => OutputEntry {
                    size: Some(file.size),
                    ..OutputEntry::failed(
                        None,
                        Some(file.name),
                        "cap_reached",
                        format!(
                            "the job's outputs already hold the most they may ({} bytes)",
                            crate::job::outputs::MAX_BYTES
                        ),
                    )
                },
            });
        }
    }

    pub(super) fn on_error(&mut self, error: OutputError) -> Result<(), String> {
        if self.file.is_some() {
            return Err("the sandbox sent an output error inside an output file".into());
        }
        if !self.request.patterns.contains(&error.pattern) {
            return Err(format!(
                "the sandbox answered output pattern {:?}, which the job did not give",
                error.pattern.chars().take(80).collect::<String>()
            ));
        }
        let code_ok = !error.error.is_empty()
            && error.error.len() <= CODE_BYTES
            && error
                .error
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b == b'_');
        if !code_ok {
            return Err("the sandbox sent an output error with a bad code".into());
        }
        if let Some(name) = &error.name {
            check_file_name(name).map_err(|problem| {
                format!("the sandbox sent an output error with a bad name: {problem}")
            })?;
        }
        self.has_room_for_entry()?;
        let message: String = error.message.chars().take(MESSAGE_CHARS).collect();
        self.entries.push(OutputEntry::failed(
            Some(error.pattern),
            error.name,
            &error.error,
            message,
        ));
        Ok(())
    }

    /// The stage ended (its `stage_end` came): its entries, and the bytes
    /// they hold. A supervisor that answered nothing is one that does not
    /// know outputs (an older image): each pattern says so.
    pub(super) fn finish(self) -> Result<(Vec<OutputEntry>, u64), String> {
        if let Some(file) = self.file {
            return Err(format!(
                "the sandbox ended the stage inside output file {:?}",
                file.name
            ));
        }
        if self.entries.is_empty() {
            return Ok((
                OutputEntry::for_each(
                    &self.request.patterns,
                    "not_collected",
                    "the sandbox's supervisor sent no outputs (its image may be older than this worker: rebuild the images)",
                ),
                0,
            ));
        }
        let held = self
            .entries
            .iter()
            .filter_map(|e| e.content.as_ref())
            .map(|c| c.len() as u64)
            .sum();
        Ok((self.entries, held))
    }

    /// The stage never reported its end (the sandbox died, or the deadline
    /// cut it): what came is kept, and each pattern that got no answer
    /// says why.
    pub(super) fn unreported(self) -> Vec<OutputEntry> {
        let mut entries = self.entries;
        let answered: std::collections::HashSet<Option<String>> =
            entries.iter().map(|e| e.pattern.clone()).collect();
        if entries.is_empty() || answered.len() < self.request.patterns.len() {
            entries.extend(OutputEntry::for_each(
                &self.request.patterns,
                "not_collected",
                "the sandbox ended before the files were collected",
            ));
        }
        entries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collector(room: u64) -> OutputCollector {
        OutputCollector::new(
            OutputRequest {
                patterns: vec!["out/*".into()],
                max_files: 2,
                max_bytes: 10,
            },
            room,
        )
    }

    fn file(name: &str, size: u64) -> OutputFile {
        OutputFile {
            name: name.into(),
            size,
        }
    }

    #[test]
    fn files_come_whole_with_their_digest() {
        let mut c = collector(100);
        c.on_file(file("out/a", 3)).unwrap();
        c.on_data(vec![1, 2]).unwrap();
        c.on_data(vec![3]).unwrap();
        c.on_file(file("out/empty", 0)).unwrap();
        let (entries, held) = c.finish().unwrap();
        assert_eq!(held, 3);
        assert_eq!(entries[0].content.as_deref(), Some(&[1u8, 2, 3][..]));
        assert_eq!(entries[1].size, Some(0));
    }

    #[test]
    fn a_sandbox_past_the_request_or_its_sizes_is_refused() {
        let mut c = collector(100);
        assert!(c.on_file(file("out/a", 11)).is_err(), "over max_bytes");
        let mut c = collector(100);
        c.on_file(file("out/a", 1)).unwrap();
        assert!(c.on_data(vec![1, 2]).is_err(), "past its size");
        let mut c = collector(100);
        assert!(c.on_data(vec![1]).is_err(), "bytes of no file");
        let mut c = collector(100);
        assert!(c.on_file(file("../etc/passwd", 1)).is_err());
        let mut c = collector(100);
        c.on_file(file("out/a", 0)).unwrap();
        c.on_file(file("out/b", 0)).unwrap();
        assert!(c.on_file(file("out/c", 0)).is_err(), "over max_files");
        let mut c = collector(100);
        let error = OutputError {
            pattern: "other".into(),
            name: None,
            error: "not_found".into(),
            message: String::new(),
        };
        assert!(c.on_error(error).is_err(), "a pattern not asked");
        let mut c = collector(100);
        c.on_file(file("out/a", 2)).unwrap();
        assert!(c.finish().is_err(), "a file cut short");
    }

    #[test]
    fn a_file_over_the_jobs_room_is_read_past_and_said() {
        let mut c = collector(2);
        c.on_file(file("out/a", 3)).unwrap();
        c.on_data(vec![1, 2, 3]).unwrap();
        let (entries, held) = c.finish().unwrap();
        assert_eq!(held, 0);
        assert_eq!(entries[0].error.as_deref(), Some("cap_reached"));
        assert_eq!(entries[0].name.as_deref(), Some("out/a"));
        assert_eq!(entries[0].content, None);
    }

    #[test]
    fn a_supervisor_that_answered_nothing_is_said_per_pattern() {
        let (entries, _) = collector(100).finish().unwrap();
        assert_eq!(entries[0].pattern.as_deref(), Some("out/*"));
        assert_eq!(entries[0].error.as_deref(), Some("not_collected"));
    }
}
