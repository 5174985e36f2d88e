//! The supervisor's two frame streams.
//!
//! - [`FrameSink`]: every frame the supervisor sends goes through one writer
//!   thread that owns stdout, so frames are written whole and never
//!   interleaved. The queue in front of it is bounded; the stage loop stops
//!   reading the stage's pipes while it is full, so a slow host slows the
//!   stage down instead of growing the supervisor's memory.
//! - [`spawn_host_reader`]: a thread that reads stdin, decodes frames and
//!   hands them to the async side. It never waits for anything but stdin, so
//!   a stage that does not read its input never stalls the frame reader.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::os::fd::AsFd;
use std::thread::JoinHandle;

use tokio::sync::mpsc;

use super::{InitError, spawn_thread};
use code_runner_protocol::{FrameDecoder, FrameError, HostMessage, MAX_HOST_FRAME, SandboxMessage};

/// Frames that may wait for the writer thread. Output frames are at most
/// [`code_runner_protocol::MAX_OUTPUT_CHUNK`] bytes, so this bounds the queue to
/// about 4 MiB.
const SINK_FRAMES: usize = 64;

/// Bytes read from stdin at a time.
const HOST_READ_BUFFER: usize = 256 * 1024;

/// The only writer of the supervisor's stdout.
pub(crate) struct FrameSink {
    tx: Option<mpsc::Sender<Vec<u8>>>,
    writer: Option<JoinHandle<()>>,
}

impl FrameSink {
    /// Starts the writer thread on a duplicate of stdout.
    pub(crate) fn start() -> Result<Self, InitError> {
        let stdout = std::io::stdout()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|source| InitError::Thread {
                thread: "frame writer",
                source,
            })?;
        let (tx, rx) = mpsc::channel(SINK_FRAMES);
        let writer = spawn_thread("frame-writer", move || write_frames(rx, File::from(stdout)))?;
        Ok(Self {
            tx: Some(tx),
            writer: Some(writer),
        })
    }

    /// Whether a frame can be queued without waiting. Also true once the
    /// writer is gone, so that the next [`FrameSink::send`] reports it.
    pub(crate) fn has_room(&self) -> bool {
        self.tx
            .as_ref()
            .is_none_or(|tx| tx.is_closed() || tx.capacity() > 0)
    }

    /// Resolves once a frame can be queued (or the writer is gone).
    pub(crate) async fn room(&self) {
        if let Some(tx) = &self.tx {
            // Taking and dropping a permit only waits for a free slot.
            let _ = tx.reserve().await;
        }
    }

    /// Queues one frame, waiting while the queue is full.
    pub(crate) async fn send(&self, message: &SandboxMessage) -> Result<(), InitError> {
        let tx = self.tx.as_ref().ok_or(InitError::HostGone)?;
        tx.send(message.encode())
            .await
            .map_err(|_| InitError::HostGone)
    }

    /// A handle that queues frames from another thread (blocking while the
    /// queue is full); `None` once the writer is gone.
    pub(crate) fn sender(&self) -> Option<mpsc::Sender<Vec<u8>>> {
        self.tx.clone()
    }

    /// Queues one frame from outside the async runtime.
    pub(crate) fn send_blocking(&self, message: &SandboxMessage) -> Result<(), InitError> {
        let tx = self.tx.as_ref().ok_or(InitError::HostGone)?;
        tx.blocking_send(message.encode())
            .map_err(|_| InitError::HostGone)
    }

    /// Lets the writer thread write and flush every queued frame, then
    /// waits for it. Must be called outside the async runtime.
    pub(crate) fn finish(mut self) {
        self.tx = None;
        if let Some(writer) = self.writer.take()
            && writer.join().is_err()
        {
            eprintln!("code-runner-init: the frame writer thread panicked");
        }
    }
}

fn write_frames(mut rx: mpsc::Receiver<Vec<u8>>, stdout: File) {
    let mut out = BufWriter::with_capacity(256 * 1024, stdout);
    while let Some(frame) = rx.blocking_recv() {
        if let Err(error) = out.write_all(&frame) {
            eprintln!("code-runner-init: writing a frame to stdout failed: {error}");
            return;
        }
        // Write whatever else is already queued, then flush once.
        while let Ok(frame) = rx.try_recv() {
            if let Err(error) = out.write_all(&frame) {
                eprintln!("code-runner-init: writing a frame to stdout failed: {error}");
                return;
            }
        }
        if let Err(error) = out.flush() {
            eprintln!("code-runner-init: flushing stdout failed: {error}");
            return;
        }
    }
}

/// What the stdin reader thread saw.
#[derive(Debug)]
pub(crate) enum HostEvent {
    Message(HostMessage),
    /// Clean end of stream (at a frame boundary).
    Eof,
    /// The stream is out of sync or a frame did not parse; nothing follows.
    Malformed(FrameError),
    /// Reading stdin failed; nothing follows.
    ReadError(std::io::Error),
}

/// Starts the thread that reads host frames from stdin.
pub(crate) fn spawn_host_reader() -> Result<mpsc::UnboundedReceiver<HostEvent>, InitError> {
    let (tx, rx) = mpsc::unbounded_channel();
    spawn_thread("host-reader", move || read_host_frames(&tx))?;
    Ok(rx)
}

fn read_host_frames(tx: &mpsc::UnboundedSender<HostEvent>) {
    let mut stdin = std::io::stdin().lock();
    let mut decoder = FrameDecoder::new(MAX_HOST_FRAME);
    let mut buffer = vec![0u8; HOST_READ_BUFFER];
    loop {
        let read = match stdin.read(&mut buffer) {
            Ok(read) => read,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(error) => {
                let _ = tx.send(HostEvent::ReadError(error));
                return;
            }
        };
        if read == 0 {
            let _ = tx.send(match decoder.finish() {
                Ok(()) => HostEvent::Eof,
                Err(error) => HostEvent::Malformed(error),
            });
            return;
        }
        decoder.extend(&buffer[..read]);
        loop {
            let event = match decoder.next_frame() {
                Ok(None) => break,
                Ok(Some(frame)) => match HostMessage::decode(frame) {
                    Ok(message) => HostEvent::Message(message),
                    Err(error) => HostEvent::Malformed(error),
                },
                Err(error) => HostEvent::Malformed(error),
            };
            let stop = matches!(event, HostEvent::Malformed(_));
            if tx.send(event).is_err() || stop {
                return;
            }
        }
    }
}

/// Short name of a host message, for error messages.
pub(crate) fn host_message_name(message: &HostMessage) -> &'static str {
    match message {
        HostMessage::Bundle(_) => "bundle",
        HostMessage::Stdin(_) => "stdin",
        HostMessage::StdinClose => "stdin_close",
        HostMessage::Signal(_) => "signal",
        HostMessage::Run(_) => "run",
        HostMessage::RunsEnd => "runs_end",
        HostMessage::Prestart(_) => "prestart",
    }
}
