//! What `code-runner run` writes to the terminal: the program's output as it
//! arrives over the stream, and at the end whatever of the result's output
//! the stream did not carry.
//!
//! The run stage's output is written as it comes. The compile stage's output
//! is held back and shown only if compilation failed (as the polling client
//! always did: a successful compiler's warnings are not the program's
//! output). At the end, the deciding stage's output in the result is written
//! from where the stream left off, so the same bytes are never written twice
//! and none are lost: a worker that does not stream output, a stream that
//! was given up for polling, or a tail the stream did not deliver are all
//! completed from the result.

use std::io::Write as _;

use super::stream::EventSink;
use crate::job::JobResult;

/// The bytes of one stage seen on the stream, per stream.
#[derive(Debug, Default)]
struct Seen {
    stdout: usize,
    stderr: usize,
}

#[derive(Debug, Default)]
pub(super) struct Printer {
    /// `--json`: the job view is printed at the end instead.
    quiet: bool,
    /// The stage the latest `stage` start event named.
    compiling: bool,
    /// Compile output held back: (stderr?, bytes), in order.
    held: Vec<(bool, Vec<u8>)>,
    compile: Seen,
    run: Seen,
}

impl Printer {
    pub(super) fn new(quiet: bool) -> Self {
        Self {
            quiet,
            ..Default::default()
        }
    }

    /// Writes what the result has that the stream did not deliver: the run
    /// stage's rest, or (compilation failed) the compiler's output.
    pub(super) fn finish(&mut self, result: &JobResult) {
        if self.quiet {
            return;
        }
        if let Some(run) = &result.run {
            rest(run.stdout.as_bytes(), self.run.stdout, false);
            rest(run.stderr.as_bytes(), self.run.stderr, true);
        } else if let Some(compile) = &result.compile {
            for (stderr, bytes) in std::mem::take(&mut self.held) {
                write(stderr, &bytes);
            }
            rest(compile.stdout.as_bytes(), self.compile.stdout, false);
            rest(compile.stderr.as_bytes(), self.compile.stderr, true);
        }
    }
}

impl EventSink for Printer {
    fn stage_started(&mut self, stage: &str) {
        self.compiling = stage == "compile";
    }

    fn output(&mut self, stderr: bool, bytes: Vec<u8>) {
        if self.compiling {
            let seen = &mut self.compile;
            *if stderr {
                &mut seen.stderr
            } else {
                &mut seen.stdout
            } += bytes.len();
            self.held.push((stderr, bytes));
            return;
        }
        let seen = &mut self.run;
        *if stderr {
            &mut seen.stderr
        } else {
            &mut seen.stdout
        } += bytes.len();
        if !self.quiet {
            write(stderr, &bytes);
        }
    }

    /// An `attempt` event: the job's worker was lost and the job runs again
    /// from the start. What was written of the lost attempt stays on the
    /// terminal (it cannot be taken back); a line on stderr says it is void,
    /// and the new attempt's output is counted from zero.
    fn new_attempt(&mut self, attempt: u32) {
        self.compiling = false;
        self.held.clear();
        self.compile = Seen::default();
        self.run = Seen::default();
        if !self.quiet {
            write(
                true,
                format!(
                    "\ncode-runner: the job's worker was lost; it runs again (attempt {attempt}) and its output starts over\n"
                )
                .as_bytes(),
            );
        }
    }
}

fn rest(all: &[u8], seen: usize, stderr: bool) {
    if let Some(rest) = all.get(seen..)
        && !rest.is_empty()
    {
        write(stderr, rest);
    }
}

fn write(stderr: bool, bytes: &[u8]) {
    // A closed pipe (`| head`) is not the program's failure.
    if stderr {
        let mut out = std::io::stderr().lock();
        let _ = out.write_all(bytes);
        let _ = out.flush();
    } else {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(bytes);
        let _ = out.flush();
    }
}
