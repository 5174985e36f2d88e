//! The frame protocol spoken between the worker and `code-runner-init`, the
//! supervisor that runs as PID 1 inside every sandbox.
//!
//! # Wire format
//!
//! Both directions use the same framing on a byte stream (the container's stdin
//! for host → sandbox, the container's stdout for sandbox → host):
//!
//! ```text
//! frame   := length:u32 (big endian) kind:u8 payload
//! length  := 1 + len(payload)            (the kind byte is counted)
//! ```
//!
//! A reader refuses a frame whose `length` is 0 or larger than its bound
//! ([`MAX_HOST_FRAME`] for what the sandbox reads, [`MAX_SANDBOX_FRAME`] for what
//! the worker reads) before reading the payload, so a hostile peer cannot make it
//! allocate without bound. Unknown kinds and payloads that do not parse are
//! errors, never panics.
//!
//! Host → sandbox kinds:
//!
//! | kind | name        | payload                                     |
//! |------|-------------|---------------------------------------------|
//! | 0x01 | bundle      | JSON [`Bundle`]: files, stages, uid/gid     |
//! | 0x02 | stdin       | raw bytes for the stage that takes stdin    |
//! | 0x03 | stdin_close | empty                                       |
//! | 0x04 | signal      | one byte: 1 = interrupt, 2 = kill           |
//! | 0x05 | run         | JSON [`RunSpec`]: one more run of the plan  |
//! | 0x06 | runs_end    | empty: no more runs                         |
//! | 0x07 | prestart    | JSON [`Prestart`]: start a warm runtime (before the bundle only) |
//!
//! Sandbox → host kinds:
//!
//! | kind | name        | payload                                     |
//! |------|-------------|---------------------------------------------|
//! | 0x81 | ready       | JSON [`Ready`] (protocol version)           |
//! | 0x82 | stage_start | JSON [`StageStart`]                         |
//! | 0x83 | stdout      | raw bytes written by the stage              |
//! | 0x84 | stderr      | raw bytes written by the stage              |
//! | 0x85 | stage_end   | JSON [`StageReport`]                        |
//! | 0x86 | fatal       | JSON [`Fatal`]: the supervisor itself failed |
//! | 0x87 | done        | empty: every stage has been reported        |
//! | 0x88 | input_wanted | empty: the stage waits for stdin            |
//! | 0x89 | output_file | JSON [`OutputFile`]: an output file, its bytes follow |
//! | 0x8A | output_data | raw bytes of that file (at most [`MAX_OUTPUT_CHUNK`] a frame) |
//! | 0x8B | output_error | JSON [`OutputError`]: an output not sent, and why |
//!
//! A warm sandbox may get one `prestart` before its bundle: the supervisor
//! starts the runtime it names, and the bundle's first stage runs on it if it
//! fits (`stage_start` then says `warm_runtime`); see [`Prestart`].
//!
//! The sandbox sends `ready` first, then for each stage it runs `stage_start`,
//! any number of `stdout`/`stderr`, and `stage_end`; finally `done`, after which
//! it exits 0. A stage that does not exit 0 ends the sequence.
//!
//! A stage whose spec asks for `outputs` ([`OutputRequest`]) has its files
//! sent after its processes are gone and before its `stage_end`: per file an
//! `output_file` and its bytes in `output_data` frames, and an
//! `output_error` for each pattern or file not sent. A stage that asks none
//! gets none of these frames, as before they existed.
//!
//! A bundle with a [`RunPlan`] (a graded job's tests) goes on after its
//! stages succeeded: the supervisor runs one stage per `run` frame, in the
//! order they came (the host may send them early; they wait), each reported
//! like a stage (`stage_start`, output, `stage_end`, whatever its exit), and
//! sends `done` after `runs_end`. See [`RunPlan`] for what each run finds.
//!
//! # Layout
//!
//! Everything below is re-exported at the crate's root.
//!
//! - `codec`: the framing, an incremental decoder with its bound, and the
//!   encoder.
//! - `messages`: the messages of both directions, their kind bytes, and
//!   the sandbox's report payloads.
//! - `bundle`: the bundle, its stages and limits, the runs and the egress
//!   relay it may ask for.
//! - `prestart`: the warm runtime started before the bundle, and which
//!   first stage may run on it.
//!
//! This crate is the only contract between the worker and the supervisor:
//! the daemon (as `code_runner::protocol`) and `code-runner-init` both
//! compile it, and neither depends on the other. It needs only serde,
//! serde_json, base64, bytes and thiserror. Property tests check that no
//! input panics a decoder and that frames survive any chunking.

#![forbid(unsafe_code)]

mod bundle;
mod codec;
mod messages;
mod prestart;

pub use bundle::*;
pub use codec::{FrameDecoder, FrameError, RawFrame, encode_frame};
pub use messages::*;
pub use prestart::*;

/// Version of this protocol; images carry it as the label `code-runner.protocol`
/// so the worker refuses an image whose supervisor speaks another version.
pub const PROTOCOL_VERSION: u32 = 3;

/// Largest frame the sandbox accepts from the host (the bundle carries files).
pub const MAX_HOST_FRAME: usize = 96 * 1024 * 1024;

/// Largest frame the worker accepts from the sandbox. Output chunks are at
/// most [`MAX_OUTPUT_CHUNK`]; control frames are small JSON.
pub const MAX_SANDBOX_FRAME: usize = 256 * 1024;

/// Largest stdout/stderr chunk the supervisor puts in one frame.
pub const MAX_OUTPUT_CHUNK: usize = 64 * 1024;

/// How long after its start a fed warm runtime may take to open its FIFO
/// (`Prestart::fed`): a job that comes before waits for it until then, and
/// one that comes later to a runtime that has not starts afresh instead.
/// Only a runtime that hangs should reach it (why 10 s, and what R takes
/// under gVisor: docs/warm-runtimes.md). The host allows a warm sandbox
/// this much more before its first stage starts.
pub const FIFO_OPEN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
