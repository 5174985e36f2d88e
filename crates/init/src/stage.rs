//! Running one stage: from `stage_start` to the [`StageReport`].
//!
//! 1. **Running**: one `select!` loop forwards output as it arrives (no line
//!    buffering), feeds queued stdin as fast as the stage reads it (the
//!    pipes themselves are read and written by the threads of
//!    [`super::pipes`]), applies
//!    host signals, reaps children on SIGCHLD, and checks the wall, idle and
//!    CPU limits (CPU polled every [`CPU_POLL`] once the limit is within
//!    reach, see [`cpu_poll_in`]). Any limit kills every
//!    process of the job's uid. The phase ends when the stage's main process
//!    is reaped.
//! 2. **Cleanup**: every leftover process of the uid is killed, and the
//!    supervisor checks in `/proc` that none is left before the next stage;
//!    if some survive every kill for [`CLEANUP_TIMEOUT`], the supervisor
//!    stops with a fatal error rather than run another stage beside them.
//! 3. **Drain**: the pipes are read to EOF, for at most [`DRAIN_TIMEOUT`]
//!    of waiting for them (time spent waiting for the host to take frames
//!    does not count); output still open then is cut, and the report says
//!    `output_truncated`.
//!
//! This file holds the loop of each phase, the limits and the report;
//! [`streams`] what the running loop does with the stage's stdin and
//! output, and when it says `input_wanted`.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::InitError;
use super::accounting::{LimitCounters, cpu_ceiling_ms, sample_uid, usable_cpu_millis};
use super::kill::Target;
use super::pipes::{InputPipe, OutputPipe};
use super::reap::{Reap, Reaped, Termination, reap_next};
use super::report::{Facts, classify, not_started};
use super::spawn::{SpawnError, spawn_stage};
use super::supervisor::{Context, Control};
use super::watch;
use code_runner_protocol::{
    Reason, SandboxMessage, StageLimits, StageReport, StageSpec, StageStart,
};

mod streams;

use streams::{Stream, next_output, writable};

/// How often the job's CPU time is read from `/proc` while it could pass its
/// CPU limit before the next read (see [`cpu_poll_in`]).
const CPU_POLL: Duration = Duration::from_millis(50);
/// Longest time between two reads of the job's CPU time (and reaps that do
/// not wait for SIGCHLD).
const CPU_POLL_MAX: Duration = Duration::from_secs(1);
/// How long a kill may take before it is sent again.
const KILL_RETRY: Duration = Duration::from_millis(500);
/// How long to read the pipes after the stage ended. Every process of the
/// job is gone by then (the cleanup checked), so what is still in a pipe
/// was written before the end and only waits for its reading thread: on a
/// machine with hundreds of sandboxes per CPU that thread can go unscheduled
/// for most of a second (500 ms cut a finished hello world's whole output,
/// 1 run in 300 of a 300-run burst on 2 CPUs). The bound is for a pipe held
/// open from outside the job.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the cleanup kills and checks before it gives up.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(3);
/// Pause between two cleanup rounds.
const CLEANUP_PAUSE: Duration = Duration::from_millis(10);
/// How soon the output pipes are looked at again when a process waits for
/// stdin and output written before the wait is still on its way.
const DRAIN_RECHECK: Duration = Duration::from_millis(1);

/// Runs one stage and returns its report (not yet sent). An error means the
/// supervisor cannot go on; the caller sends `fatal`.
pub(crate) async fn run_stage(
    ctx: &mut Context<'_>,
    spec: &StageSpec,
) -> Result<StageReport, InitError> {
    // The warm runtime, if this stage runs on it (only the first stage can:
    // see `keep_if_fits`).
    let mut runtime = None;
    if let Some(warm) = ctx.runtime.take() {
        match warm.args_for(spec, ctx.uid, ctx.gid) {
            Some(args) => runtime = Some((warm, args)),
            None => warm.discard(&mut ctx.killer, ctx.uid).await,
        }
    }
    ctx.sink
        .send(&SandboxMessage::StageStart(StageStart {
            stage: spec.name.clone(),
            warm_runtime: runtime.is_some(),
        }))
        .await?;
    ctx.apply_waiting_host_events()?;
    if ctx.kill_requested {
        if let Some((warm, _)) = runtime {
            warm.discard(&mut ctx.killer, ctx.uid).await;
        }
        return Ok(not_started(spec, Reason::Killed));
    }
    let counters_before = ctx.cgroups.read();
    let started = Instant::now();
    let spawned = match runtime {
        Some((warm, args)) => warm.release(args).map_err(SpawnError::Pipes),
        None => spawn_stage(spec, ctx.uid, ctx.gid, ctx.run_filter.as_ref()),
    };
    let spawned = match spawned {
        Ok(spawned) => spawned,
        Err(SpawnError::Start(error)) => {
            let program = spec.argv.first().map_or("", String::as_str);
            let message = format!(
                "code-runner-init: cannot run {program:?} in {:?}: {error}\n",
                spec.cwd
            );
            ctx.sink
                .send(&SandboxMessage::Stderr(message.into_bytes()))
                .await?;
            return Ok(StageReport {
                exit_code: Some(127),
                wall_ms: millis(started.elapsed()),
                ..not_started(spec, Reason::Exited)
            });
        }
        Err(SpawnError::Pipes(source)) => {
            return Err(InitError::StagePipes {
                stage: spec.name.clone(),
                source,
            });
        }
    };
    let cpu_millis = usable_cpu_millis(spec.limits.cpu_quota_millis);
    let mut run = Run {
        pid: spawned.pid,
        limits: spec.limits,
        started,
        stdin: spawned.stdin,
        stdout: Some(spawned.stdout),
        stderr: Some(spawned.stderr),
        output_total: 0,
        truncated: false,
        reason: None,
        kill_sent: None,
        last_activity: started,
        // No CPU is used yet: the first read of it comes when the limit
        // could first be reached, as every later one.
        next_poll: started + cpu_poll_in(spec.limits.cpu_ms, 0, cpu_millis),
        polled_cpu_ms: 0,
        orphan_cpu_ms: 0,
        cpu_millis,
        exit: None,
        watch: spec.watches_input(),
        holding: false,
        input_wait: false,
        input_wanted_said: false,
    };
    if run.watch
        && let Some(probe) = run.stdin.as_ref().and_then(InputPipe::probe)
    {
        watch::watch(probe, ctx.uid, ctx.gid);
    }
    run.supervise(ctx).await?;
    run.close_stdin();
    run.clean_up(ctx, spec).await?;
    run.drain(ctx).await?;
    Ok(run.report(spec, &counters_before, &ctx.cgroups.read()))
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The state of the running stage.
struct Run {
    pid: i32,
    limits: StageLimits,
    started: Instant,
    stdin: Option<InputPipe>,
    stdout: Option<OutputPipe>,
    stderr: Option<OutputPipe>,
    /// stdout + stderr bytes the stage wrote (counted up to the limit).
    output_total: u64,
    truncated: bool,
    /// Why the supervisor killed the stage; the first reason wins.
    reason: Option<Reason>,
    kill_sent: Option<Instant>,
    /// Last stdin frame or output, for the idle limit.
    last_activity: Instant,
    next_poll: Instant,
    /// Largest CPU total seen while polling.
    polled_cpu_ms: u64,
    /// CPU time of the job's orphans reaped by the supervisor.
    orphan_cpu_ms: u64,
    /// Thousandths of a CPU the job can use at once, for [`cpu_ceiling_ms`].
    cpu_millis: u64,
    /// The main process, once reaped, and when.
    exit: Option<(Reaped, Instant)>,
    /// Say `input_wanted` when a process waits for stdin (see `watch`).
    watch: bool,
    /// A reader is held at its stop until the stdin thread's write is done.
    holding: bool,
    /// A process went to wait for stdin with nothing buffered for it:
    /// `input_wanted` is to be said (after the output written before).
    input_wait: bool,
    /// `input_wanted` was said and neither input nor output came since.
    input_wanted_said: bool,
}

/// How long after a read of the job's CPU time (`used_ms` of `limit_ms`) the
/// next one is due. Its processes cannot use more than `cpu_millis`
/// thousandths of a CPU at once, so they cannot pass the limit sooner than
/// what is left of it at that rate: until then nothing is read (at most
/// [`CPU_POLL_MAX`]), and from then on every [`CPU_POLL`]. A job waiting for
/// input (a student reading the prompt) is then read once a second, not
/// twenty times, and a busy one still overshoots its limit by at most one
/// [`CPU_POLL`] at its CPUs' rate, as before.
fn cpu_poll_in(limit_ms: u64, used_ms: u64, cpu_millis: u64) -> Duration {
    let left = u128::from(limit_ms.saturating_sub(used_ms));
    let soonest = match cpu_millis {
        u64::MAX => 0,
        rate => u64::try_from(left * 1000 / u128::from(rate.max(1))).unwrap_or(u64::MAX),
    };
    Duration::from_millis(soonest).clamp(CPU_POLL, CPU_POLL_MAX)
}

impl Run {
    /// The running phase; returns once the main process has been reaped.
    async fn supervise(&mut self, ctx: &mut Context<'_>) -> Result<(), InitError> {
        self.feed_stdin(ctx);
        while self.exit.is_none() {
            let now = Instant::now();
            if now >= self.next_poll {
                self.reap();
                self.poll_cpu(ctx);
                self.next_poll =
                    now + cpu_poll_in(self.limits.cpu_ms, self.polled_cpu_ms, self.cpu_millis);
            }
            self.check_deadlines(ctx, now);
            if self.exit.is_some() {
                break;
            }
            // After every reap: the stops of a watched stage come with them.
            self.note_input_wait(ctx);
            self.say_input_wanted(ctx).await?;
            let wake = self.next_wake(now);
            tokio::select! {
                biased;
                _ = ctx.signals.child.recv() => {
                    self.reap();
                }
                _ = ctx.signals.terminate.recv() => self.terminate(ctx),
                _ = ctx.signals.interrupt.recv() => self.terminate(ctx),
                event = ctx.host.recv(), if ctx.host_open => {
                    match ctx.on_host_event(event)? {
                        Control::None => {}
                        Control::Input => self.last_activity = Instant::now(),
                        Control::Interrupt => self.signal_group(ctx, Signal::SIGINT),
                        Control::Kill => {
                            // In a run plan a kill ends the runs too: the
                            // host stopped the job, not just this test.
                            if ctx.run_filter.is_some() {
                                ctx.kill_requested = true;
                            }
                            self.kill(ctx, Reason::Killed)
                        }

                    }
                    self.feed_stdin(ctx);
                }
                output = next_output(self.stdout.as_mut()), if ctx.sink.has_room() => {
                    self.on_output(ctx, Stream::Stdout, output).await?;
                }
                output = next_output(self.stderr.as_mut()), if ctx.sink.has_room() => {
                    self.on_output(ctx, Stream::Stderr, output).await?;
                }
                _ = ctx.sink.room(), if !ctx.sink.has_room() => {}
                _ = writable(self.stdin.as_ref()), if ctx.stdin.has_pending() => self.feed_stdin(ctx),
                _ = tokio::time::sleep_until(wake.into()) => {}
            }
        }
        Ok(())
    }

    /// The earliest instant something must be checked.
    fn next_wake(&self, now: Instant) -> Instant {
        let mut wake = self.next_poll;
        if self.input_wait || self.holding {
            // The output is on its way, or a reader is held until the
            // stdin thread's write is done: look again soon.
            wake = wake.min(now + DRAIN_RECHECK);
        }
        match self.kill_sent {
            Some(sent) => wake = wake.min(sent + KILL_RETRY),
            None => {
                if let Some(deadline) = self.wall_deadline() {
                    wake = wake.min(deadline);
                }
                if let Some(deadline) = self.idle_deadline() {
                    wake = wake.min(deadline);
                }
            }
        }
        wake
    }

    fn wall_deadline(&self) -> Option<Instant> {
        self.started
            .checked_add(Duration::from_millis(self.limits.wall_ms))
    }

    fn idle_deadline(&self) -> Option<Instant> {
        let idle = self.limits.idle_ms?;
        self.last_activity.checked_add(Duration::from_millis(idle))
    }

    fn check_deadlines(&mut self, ctx: &mut Context<'_>, now: Instant) {
        if let Some(sent) = self.kill_sent {
            if now >= sent + KILL_RETRY {
                // The main process has not died yet (a fork bomb under
                // gVisor can outrun one kill): kill again.
                self.send_kill_all(ctx);
            }
            return;
        }
        if self.wall_deadline().is_some_and(|deadline| now >= deadline) {
            self.kill(ctx, Reason::WallTimeout);
        } else if self.idle_deadline().is_some_and(|deadline| now >= deadline) {
            self.kill(ctx, Reason::IdleTimeout);
        }
    }

    fn poll_cpu(&mut self, ctx: &mut Context<'_>) {
        let sample = sample_uid(ctx.uid);
        // Capped at what the CPUs can give since the start: gVisor reports
        // far more for many concurrent processes (see `cpu_ceiling_ms`).
        let total = sample
            .cpu_ms
            .saturating_add(self.orphan_cpu_ms)
            .min(cpu_ceiling_ms(self.started.elapsed(), self.cpu_millis));
        self.polled_cpu_ms = self.polled_cpu_ms.max(total);
        if self.polled_cpu_ms > self.limits.cpu_ms {
            self.kill(ctx, Reason::CpuTimeout);
        }
    }

    /// SIGTERM or SIGINT to the supervisor: kill the stage, run no more.
    fn terminate(&mut self, ctx: &mut Context<'_>) {
        ctx.kill_requested = true;
        self.kill(ctx, Reason::Killed);
    }

    /// Kills every process of the job for `reason` (the first reason sticks).
    fn kill(&mut self, ctx: &mut Context<'_>, reason: Reason) {
        self.reason.get_or_insert(reason);
        if self.exit.is_none() && self.kill_sent.is_none() {
            self.send_kill_all(ctx);
        }
    }

    fn send_kill_all(&mut self, ctx: &mut Context<'_>) {
        ctx.killer.signal(Target::All, Signal::SIGKILL);
        self.kill_sent = Some(Instant::now());
    }

    fn signal_group(&mut self, ctx: &mut Context<'_>, signal: Signal) {
        if self.exit.is_none() {
            ctx.killer.signal(Target::Group(self.pid), signal);
        }
    }

    /// Reaps every child that has ended: the main process and orphans.
    /// `true` when the supervisor then has no child at all ([`Reap::NoChildren`]).
    fn reap(&mut self) -> bool {
        loop {
            match reap_next() {
                Reap::Ended(reaped) if reaped.pid == self.pid => {
                    self.exit = Some((reaped, Instant::now()));
                }
                Reap::Ended(reaped) => {
                    // An orphan of the job.
                    self.orphan_cpu_ms = self.orphan_cpu_ms.saturating_add(reaped.cpu_ms);
                }
                Reap::Nothing => return false,
                Reap::NoChildren => return true,
            }
        }
    }
    /// Kills whatever is left of the job and checks that nothing survived,
    /// so that no process of this stage runs into the next one.
    async fn clean_up(&mut self, ctx: &mut Context<'_>, spec: &StageSpec) -> Result<(), InitError> {
        let deadline = Instant::now() + CLEANUP_TIMEOUT;
        loop {
            if self.reap() {
                // No child at all: nothing of the job is left to kill or
                // look for.
                return Ok(());
            }
            ctx.killer.signal(Target::All, Signal::SIGKILL);
            self.reap();
            if sample_uid(ctx.uid).live == 0 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(InitError::Survivors {
                    stage: spec.name.clone(),
                    seconds: CLEANUP_TIMEOUT.as_secs(),
                });
            }
            tokio::time::sleep(CLEANUP_PAUSE).await;
        }
    }

    /// Reads the pipes to EOF after the stage ended, for a bounded time: a
    /// process that escaped the kill could hold them open forever. The
    /// bound counts only the time the pipes are waited for: while the host
    /// takes no frame (a loaded worker reads late) it is not spent, so what
    /// the stage wrote before it ended is all sent. Output still open at
    /// the bound is cut, and the report says `output_truncated`.
    async fn drain(&mut self, ctx: &mut Context<'_>) -> Result<(), InitError> {
        let mut deadline = Instant::now() + DRAIN_TIMEOUT;
        while (self.stdout.is_some() || self.stderr.is_some()) && Instant::now() < deadline {
            tokio::select! {
                biased;
                _ = ctx.signals.child.recv() => {
                    self.reap();
                }
                _ = ctx.signals.terminate.recv() => ctx.kill_requested = true,
                _ = ctx.signals.interrupt.recv() => ctx.kill_requested = true,
                event = ctx.host.recv(), if ctx.host_open => {
                    if ctx.on_host_event(event)? == Control::Kill {
                        ctx.kill_requested = true;
                    }
                }
                output = next_output(self.stdout.as_mut()), if ctx.sink.has_room() => {
                    self.on_output(ctx, Stream::Stdout, output).await?;
                }
                output = next_output(self.stderr.as_mut()), if ctx.sink.has_room() => {
                    self.on_output(ctx, Stream::Stderr, output).await?;
                }
                () = ctx.sink.room(), if !ctx.sink.has_room() => {
                    deadline = deadline.max(Instant::now() + DRAIN_TIMEOUT);
                }
                () = tokio::time::sleep_until(deadline.into()), if ctx.sink.has_room() => {}
            }
        }
        if self.stdout.is_some() || self.stderr.is_some() {
            eprintln!(
                "code-runner-init: the stage's output was still open {} ms after it ended; the rest is not sent",
                DRAIN_TIMEOUT.as_millis()
            );
            self.truncated = true;
        }
        self.stdout = None;
        self.stderr = None;
        Ok(())
    }

    fn report(
        &self,
        spec: &StageSpec,
        before: &LimitCounters,
        after: &LimitCounters,
    ) -> StageReport {
        let (exit_code, signal, wall_ms, main_cpu_ms, peak) = match &self.exit {
            Some((reaped, ended)) => {
                let (code, signal) = match reaped.termination {
                    Termination::Exited(code) => (Some(code), None),
                    Termination::Signaled(signal) => (None, Some(signal)),
                };
                let wall = millis(ended.saturating_duration_since(self.started));
                (code, signal, wall, reaped.cpu_ms, reaped.max_rss_bytes)
            }
            None => (None, None, millis(self.started.elapsed()), 0, 0),
        };
        // Every process of the stage is gone by now, so the time since the
        // start bounds the CPU they used (see `cpu_ceiling_ms`).
        let cpu_ms = main_cpu_ms
            .saturating_add(self.orphan_cpu_ms)
            .max(self.polled_cpu_ms)
            .min(cpu_ceiling_ms(self.started.elapsed(), self.cpu_millis));
        let reason = self.reason.unwrap_or_else(|| {
            classify(Facts {
                exit_code,
                signal,
                cpu_ms,
                cpu_limit_ms: self.limits.cpu_ms,
                oom_killed: before.oom_killed_since(after),
                limit_hit: before.limit_hit_since(after),
            })
        });
        StageReport {
            stage: spec.name.clone(),
            exit_code,
            signal,
            reason,
            wall_ms,
            cpu_ms,
            memory_peak_bytes: peak,
            output_truncated: self.truncated,
            pids_limit_reached: before.pids_refused_since(after),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_is_read_when_the_limit_could_be_reached_at_the_cpus_rate() {
        // 2 s left on one CPU: nothing for the longest pause.
        assert_eq!(cpu_poll_in(10_000, 8_000, 1000), CPU_POLL_MAX);
        // 300 ms left on one CPU, or 600 ms left on two: 300 ms.
        assert_eq!(cpu_poll_in(1_000, 700, 1000), Duration::from_millis(300));
        assert_eq!(cpu_poll_in(1_000, 400, 2000), Duration::from_millis(300));
        // Half a CPU makes the same 300 ms last twice as long.
        assert_eq!(cpu_poll_in(1_000, 700, 500), Duration::from_millis(600));
        // Within reach, or past it: the short pause.
        assert_eq!(cpu_poll_in(1_000, 980, 1000), CPU_POLL);
        assert_eq!(cpu_poll_in(1_000, 1_500, 1000), CPU_POLL);
        // No known ceiling: the job could use any amount, read often.
        assert_eq!(cpu_poll_in(10_000, 0, u64::MAX), CPU_POLL);
        // No limit to speak of: the longest pause.
        assert_eq!(cpu_poll_in(u64::MAX, 0, 1000), CPU_POLL_MAX);
    }
}
