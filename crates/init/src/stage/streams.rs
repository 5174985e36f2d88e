//! The running stage's streams: handing queued stdin to its pipe,
//! forwarding each output chunk up to the output limit, and saying
//! `input_wanted` once a process waits for stdin and the output written
//! before the wait has been sent. The loop that calls these is in
//! [`super`].

use std::time::Instant;

use code_runner_protocol::{Reason, SandboxMessage};

use super::Run;
use crate::InitError;
use crate::pipes::{InputPipe, Offer, Output, OutputPipe};
use crate::supervisor::Context;
use crate::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stream {
    Stdout,
    Stderr,
}

/// The next chunk (or the end) of an output pipe; never when there is no pipe.
pub(super) async fn next_output(pipe: Option<&mut OutputPipe>) -> Output {
    match pipe {
        Some(pipe) => pipe.recv().await,
        None => std::future::pending().await,
    }
}

/// Resolves when the stdin pipe takes more bytes; never when there is no pipe.
pub(super) async fn writable(pipe: Option<&InputPipe>) {
    match pipe {
        Some(pipe) => pipe.ready().await,
        None => std::future::pending().await,
    }
}

impl Run {
    /// Notes a process that went to wait for stdin with nothing buffered
    /// for it, in the pipe or in the queue (the tracer saw the pipe empty
    /// before the process went on).
    pub(super) fn note_input_wait(&mut self, ctx: &Context<'_>) {
        if !self.watch {
            return;
        }
        self.holding = watch::settle();
        if !watch::take_waiting() {
            return;
        }
        if self.stdin.is_some() && !ctx.stdin.has_pending() && !self.input_wanted_said {
            self.input_wait = true;
        }
    }

    /// Says `input_wanted` for a noted wait once everything the stage wrote
    /// before it has been sent (so that a prompt comes first).
    pub(super) async fn say_input_wanted(
        &mut self,
        ctx: &mut Context<'_>,
    ) -> Result<(), InitError> {
        if !self.input_wait {
            return Ok(());
        }
        let drained = self.stdout.as_ref().is_none_or(OutputPipe::drained)
            && self.stderr.as_ref().is_none_or(OutputPipe::drained);
        if !drained {
            return Ok(());
        }
        self.input_wait = false;
        self.input_wanted_said = true;
        ctx.sink.send(&SandboxMessage::InputWanted).await
    }

    /// Closes the stage's stdin (the stage then reads EOF once the chunks
    /// handed over are written): nothing waits for input after that.
    pub(super) fn close_stdin(&mut self) {
        self.stdin = None;
        self.input_wait = false;
        if self.watch {
            watch::unwatch();
        }
    }

    /// Hands queued stdin to the stage's pipe without blocking, and closes
    /// the pipe once the host closed stdin and the queue is empty.
    pub(super) fn feed_stdin(&mut self, ctx: &mut Context<'_>) {
        let Some(pipe) = &self.stdin else {
            return;
        };
        while let Some(bytes) = ctx.stdin.front() {
            match pipe.offer(bytes) {
                Offer::Taken(written) => {
                    ctx.stdin.consume(written);
                    // Input came: the wait (if any) is over.
                    self.input_wait = false;
                    self.input_wanted_said = false;
                }
                Offer::Busy => break,
                Offer::Closed => {
                    // The stage closed its stdin (EPIPE): what is queued
                    // can never be read.
                    ctx.stdin.discard();
                    self.close_stdin();
                    return;
                }
            }
        }
        if ctx.stdin.should_close() {
            self.close_stdin();
        }
    }

    /// Forwards one chunk read from an output pipe, or forgets the pipe at
    /// its end.
    pub(super) async fn on_output(
        &mut self,
        ctx: &mut Context<'_>,
        stream: Stream,
        output: Output,
    ) -> Result<(), InitError> {
        let slot = match stream {
            Stream::Stdout => &mut self.stdout,
            Stream::Stderr => &mut self.stderr,
        };
        match output {
            Output::Eof => *slot = None,
            Output::Data(data) => {
                self.last_activity = Instant::now();
                self.forward(ctx, stream, &data).await?;
            }
            Output::Failed(error) => {
                eprintln!("code-runner-init: reading {stream:?} of the stage failed: {error}");
                *slot = None;
            }
        }
        Ok(())
    }

    /// Sends output up to the output limit; past it, sends the part that
    /// fits, kills the stage and drops the rest.
    pub(super) async fn forward(
        &mut self,
        ctx: &mut Context<'_>,
        stream: Stream,
        data: &[u8],
    ) -> Result<(), InitError> {
        if self.truncated {
            return Ok(());
        }
        let allowed = self.limits.output_bytes.saturating_sub(self.output_total);
        let length = u64::try_from(data.len()).unwrap_or(u64::MAX);
        let (send, over) = if length <= allowed {
            (data, false)
        } else {
            (&data[..usize::try_from(allowed).unwrap_or(0)], true)
        };
        self.output_total = self
            .output_total
            .saturating_add(u64::try_from(send.len()).unwrap_or(u64::MAX));
        if !send.is_empty() {
            self.input_wanted_said = false;
            let message = match stream {
                Stream::Stdout => SandboxMessage::Stdout(send.to_vec()),
                Stream::Stderr => SandboxMessage::Stderr(send.to_vec()),
            };
            ctx.sink.send(&message).await?;
        }
        if over {
            self.truncated = true;
            self.kill(ctx, Reason::OutputLimit);
        }
        Ok(())
    }
}
