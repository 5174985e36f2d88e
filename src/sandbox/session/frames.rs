//! The session's side of each frame the supervisor sends: what may come
//! when (a stage or test only in order, output only inside one), what
//! goes on to the job's events, and each stage's or test's end.

use std::time::Instant;

use super::{Failure, Session, interruption};
use crate::job::StageResult;
use crate::protocol::{PROTOCOL_VERSION, SandboxMessage, SignalKind, StageReport, StageStart};
use crate::sandbox::SandboxConfig;
use crate::sandbox::connection::protocol_mismatch;
use crate::sandbox::grading::{Interrupt, test_index};
use crate::sandbox::outcome::StageOutput;
use crate::sandbox::outputs::OutputCollector;
use crate::sandbox::{JobInput, SandboxEvent};

impl Session<'_> {
    /// Handles one message; `Ok(true)` when the supervisor is done.
    pub(super) async fn handle(
        &mut self,
        message: SandboxMessage,
        deadline: &mut tokio::time::Instant,
        config: &SandboxConfig,
    ) -> Result<bool, Failure> {
        match message {
            SandboxMessage::Ready(ready) => self.on_ready(ready.protocol, deadline, config).await?,
            SandboxMessage::StageStart(start) => match test_index(&start.stage) {
                Some(index) => self.on_test_start(start, index, deadline, config).await?,
                None => self.on_stage_start(start, deadline, config).await?,
            },
            SandboxMessage::Stdout(data) => self.on_output(data, true).await?,
            SandboxMessage::Stderr(data) => self.on_output(data, false).await?,
            SandboxMessage::StageEnd(report) => self.on_stage_end(report, deadline).await?,
            SandboxMessage::Fatal(fatal) => {
                return Err(Failure(format!(
                    "the sandbox supervisor failed: {}",
                    fatal.message
                )));
            }
            SandboxMessage::Done => return Ok(true),
            SandboxMessage::InputWanted => {
                if self.current.is_some() {
                    self.emit(SandboxEvent::InputWanted).await;
                }
            }
            SandboxMessage::OutputFile(file) => self.collector()?.on_file(file).map_err(Failure)?,
            SandboxMessage::OutputData(data) => self.collector()?.on_data(data).map_err(Failure)?,
            SandboxMessage::OutputError(error) => {
                self.collector()?.on_error(error).map_err(Failure)?
            }
        }
        Ok(false)
    }

    /// The output files of the stage running, when it asked for them.
    fn collector(&mut self) -> Result<&mut OutputCollector, Failure> {
        self.current
            .as_mut()
            .and_then(|current| current.outputs.as_mut())
            .ok_or_else(|| {
                Failure("the sandbox sent an output file no running stage asked for".into())
            })
    }

    /// The supervisor is ready (a cold sandbox's first word): the job's
    /// walls count from now.
    async fn on_ready(
        &mut self,
        protocol: u32,
        deadline: &mut tokio::time::Instant,
        config: &SandboxConfig,
    ) -> Result<(), Failure> {
        if protocol != PROTOCOL_VERSION {
            return Err(Failure(protocol_mismatch(protocol)));
        }
        if self.ready_at.is_none() {
            self.ready_at = Some(Instant::now());
            if !self.cancelled {
                *deadline = self.walls_from_now(config);
            }
            self.emit(SandboxEvent::Ready).await;
        }
        Ok(())
    }

    /// A graded job's test `index` started: only the grader's next one may.
    async fn on_test_start(
        &mut self,
        start: StageStart,
        index: usize,
        deadline: &mut tokio::time::Instant,
        config: &SandboxConfig,
    ) -> Result<(), Failure> {
        let (name, cap) = self
            .grader
            .as_ref()
            .and_then(|g| g.starting(index))
            .map(|(name, cap)| (name.to_string(), cap))
            .filter(|_| self.current.is_none())
            .ok_or_else(|| {
                Failure(format!(
                    "the sandbox started test {:?} out of order",
                    start.stage
                ))
            })?;
        let outputs = self
            .grader
            .as_ref()
            .and_then(|g| g.outputs_request())
            .map(|(request, room)| OutputCollector::new(request, room));
        self.current = Some(StageOutput::new(start.stage, cap).with_outputs(outputs));
        if let Some(grader) = &mut self.grader {
            grader.note_start(index);
        }
        self.note_started(deadline, config);
        self.emit(SandboxEvent::TestStart { index, name }).await;
        Ok(())
    }

    /// A stage of the bundle started: only one the bundle has, once, and
    /// never beside another.
    async fn on_stage_start(
        &mut self,
        start: StageStart,
        deadline: &mut tokio::time::Instant,
        config: &SandboxConfig,
    ) -> Result<(), Failure> {
        let spec = self
            .job
            .bundle
            .stages
            .iter()
            .find(|s| s.name == start.stage)
            .ok_or_else(|| {
                Failure(format!(
                    "the sandbox started an unknown stage {:?}",
                    start.stage
                ))
            })?;
        if self.current.is_some() || self.stage_slot(&start.stage).is_some() {
            return Err(Failure(format!(
                "the sandbox started stage {:?} out of order",
                start.stage
            )));
        }
        let outputs = spec
            .outputs
            .clone()
            .map(|request| OutputCollector::new(request, crate::job::outputs::MAX_BYTES));
        self.current = Some(
            StageOutput::new(start.stage.clone(), spec.limits.output_bytes).with_outputs(outputs),
        );
        self.note_started(deadline, config);
        self.warm_runtime |= start.warm_runtime;
        self.emit(SandboxEvent::StageStart { stage: start.stage })
            .await;
        Ok(())
    }

    /// Output of the stage running, kept up to its cap; a test's output
    /// goes into its result (a preview), not the stream.
    async fn on_output(&mut self, data: Vec<u8>, is_stdout: bool) -> Result<(), Failure> {
        let in_test = self.in_test();
        let Some(current) = &mut self.current else {
            return Err(Failure(format!(
                "the sandbox sent {} bytes of output outside a stage",
                data.len()
            )));
        };
        let kept = current.accept(data, is_stdout);
        if !in_test && !kept.is_empty() {
            let event = if is_stdout {
                SandboxEvent::Stdout(kept)
            } else {
                SandboxEvent::Stderr(kept)
            };
            self.emit(event).await;
        }
        Ok(())
    }

    /// The stage running ended: a test's verdict (the checker's, maybe),
    /// or a stage's result.
    async fn on_stage_end(
        &mut self,
        report: StageReport,
        deadline: &mut tokio::time::Instant,
    ) -> Result<(), Failure> {
        let mut current = self
            .current
            .take()
            .filter(|c| c.name == report.stage)
            .ok_or_else(|| {
                Failure(format!(
                    "the sandbox ended stage {:?}, which was not running",
                    report.stage
                ))
            })?;
        let (outputs, held) = match current.outputs.take() {
            Some(collector) => collector.finish().map_err(Failure)?,
            None => (Vec::new(), 0),
        };
        let result = current.into_result(Some(&report), report.reason);
        if let Some(index) = test_index(&report.stage)
            && self.grader.is_some()
        {
            self.on_test_end(index, &result, outputs, held, deadline)
                .await;
            return Ok(());
        }
        if report.stage == "run" {
            self.outputs = outputs;
        }
        self.emit(SandboxEvent::StageEnd {
            stage: report.stage.clone(),
            result: Box::new(result.clone()),
        })
        .await;
        self.store(&report.stage, result);
        Ok(())
    }

    /// A graded job's test ended: its verdict, and the next run's frames.
    /// A checker may take long: a cancel or a kill coming meanwhile stops
    /// the wait; other input waits for it.
    async fn on_test_end(
        &mut self,
        index: usize,
        result: &StageResult,
        outputs: Vec<crate::job::outputs::OutputEntry>,
        outputs_held: u64,
        deadline: &mut tokio::time::Instant,
    ) {
        let Some(grader) = &mut self.grader else {
            return;
        };
        let mut held = Vec::new();
        let stop = interruption(&self.io.cancel, &mut self.io.input, &mut held);
        let (test, frames, interrupted) = grader.finish(index, result, stop).await;
        grader.attach_outputs(index, outputs, outputs_held);
        self.emit(SandboxEvent::TestEnd(Box::new(test))).await;
        for frame in frames {
            self.send(frame).await;
        }
        for input in held {
            self.forward(input).await;
        }
        match interrupted {
            Some(Interrupt::Killed) => {
                self.forward(JobInput::Signal(SignalKind::Kill)).await;
            }
            Some(Interrupt::Cancelled) if !self.cancelled => {
                self.cancel(deadline).await;
            }
            _ => {}
        }
    }
}
