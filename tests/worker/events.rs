//! A job's live events stream as the worker writes it: output streamed as
//! it happens, a compiled job's stages in order, a flood of tiny writes
//! coalesced, output cut at the output limit, the last stage end written
//! with the result, and the stream expiring with the job.

use std::time::Duration;

use code_runner::job::events::{JobEvent, StageState};
use code_runner::job::limits::LimitsRequest;
use code_runner::job::{JobSpec, Status};

use crate::common::scripted;
use crate::common::wait_for;
use crate::monitor::Monitor;
use crate::world::{
    JOB_DEADLINE, World, checked_stream, run_stdout, stream_events, streamed_stdout,
};

fn output_events(events: &[JobEvent]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e, JobEvent::Stdout { .. } | JobEvent::Stderr { .. }))
        .count()
}

/// Calls of EVAL and EVALSHA this Redis served (every script the store
/// runs: submit, start, append_events, finish).
async fn script_calls(world: &World) -> u64 {
    let mut conn = world.redis.conn().await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .expect("INFO");
    info.lines()
        .filter(|l| l.starts_with("cmdstat_eval:") || l.starts_with("cmdstat_evalsha:"))
        .filter_map(|l| {
            l.split([':', ','])
                .find_map(|f| f.strip_prefix("calls="))
                .and_then(|n| n.parse::<u64>().ok())
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_running_jobs_events_are_streamed_as_they_happen() {
    let world = World::new().await;
    let id = world
        .submit(&scripted::job(
            "repeat 3\n  print line {i}\n  sleep 300\nend",
        ))
        .await;
    let mut worker = world.start_worker(1, Duration::from_secs(30));

    // Live: the first line is in the stream while the job still runs.
    wait_for("the first line in the stream", JOB_DEADLINE, || async {
        let events = stream_events(&world, &id).await;
        streamed_stdout(
            &events
                .iter()
                .filter_map(|e| e.event().ok())
                .collect::<Vec<_>>(),
        )
        .starts_with(b"line 0\n")
        .then_some(())
    })
    .await;
    assert_eq!(world.record(&id).await.status, Status::Running);

    let record = world.wait_terminal(&id, JOB_DEADLINE).await;
    assert_eq!(record.status, Status::Succeeded, "{record:#?}");
    let events = checked_stream(&world, &record).await;
    let result = record.result.as_ref().expect("a result");
    let run = result.run.as_ref().expect("a run stage");
    // The run's start, its output, its end, in that order.
    let last = events.len() - 1;
    assert_eq!(events[0], JobEvent::stage_start("run"));
    assert_eq!(events[last], JobEvent::stage_end("run", run));
    let chunks: Vec<Vec<u8>> = events[1..last]
        .iter()
        .map(|e| match e {
            JobEvent::Stdout { .. } => e.output_bytes().expect("output decodes"),
            other => panic!("only stdout between the stage's start and end: {other:?}"),
        })
        .collect();
    // Each line was written 300 ms after the one before, so no event holds
    // two lines. (A program may write a line's text and its newline as two
    // writes, as Python under -u does; the first output after a quiet spell
    // is sent at once, so one line may come as two events.)
    assert_eq!(chunks.concat(), b"line 0\nline 1\nline 2\n");
    for chunk in &chunks {
        let newlines = chunk.iter().filter(|b| **b == b'\n').count();
        assert!(
            newlines == 0 || (newlines == 1 && chunk.ends_with(b"\n")),
            "one event held more than one line: {:?}",
            String::from_utf8_lossy(chunk)
        );
    }
    let JobEvent::Stage {
        exit_code, reason, ..
    } = &events[last]
    else {
        unreachable!()
    };
    assert_eq!(*exit_code, Some(0));
    assert_eq!(*reason, Some(code_runner::protocol::Reason::Exited));
    assert_eq!(streamed_stdout(&events), run.stdout.as_bytes());
    world.assert_settled(&id).await;

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.assert_clean().await;
}

/// The job's last stage end goes with its result: appended by the same
/// script call (FINISH) as its `exit` event, not by an append of its own
/// just before: one Redis step less at the end of every job.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_last_stage_end_is_written_with_the_result() {
    let world = World::new().await;
    let monitor = Monitor::start(&world.redis).await;
    let id = world.submit(&scripted::job("print 42")).await;
    let mut worker = world.start_worker(1, Duration::from_secs(30));
    let record = world.wait_terminal(&id, JOB_DEADLINE).await;
    assert_eq!(record.status, Status::Succeeded, "{record:#?}");
    let lines = monitor.stop().await;

    let stored = stream_events(&world, &id).await;
    let run = record
        .result
        .as_ref()
        .and_then(|r| r.run.as_ref())
        .expect("ran");
    let end = stored
        .iter()
        .find(|e| e.event().ok() == Some(JobEvent::stage_end("run", run)))
        .expect("the run's end is in the stream");
    let exit = stored.last().expect("events");
    assert_eq!(exit.seq, end.seq + 1, "{stored:#?}");
    // The XADD of each, by its stream id `<seq>-0`.
    let xadd = |seq: u64| {
        let needle = format!("\"{seq}-0\"");
        lines
            .iter()
            .position(|l| l.contains("\"XADD\"") && l.contains(&id) && l.contains(&needle))
            .unwrap_or_else(|| panic!("no XADD of seq {seq} in {lines:#?}"))
    };
    let (end_at, exit_at) = (xadd(end.seq), xadd(exit.seq));
    assert!(end_at < exit_at, "{:#?}", &lines[end_at..=exit_at]);
    assert!(
        lines[end_at..=exit_at]
            .iter()
            .all(|l| l.contains("[0 lua]")),
        "another command came between the stage end and the exit: {:#?}",
        &lines[end_at..=exit_at]
    );
    // And that call is FINISH's: a script call, which wrote the result.
    let call = lines[..end_at]
        .iter()
        .rposition(|l| !l.contains("[0 lua]"))
        .expect("the script's call");
    assert!(
        lines[call].contains("\"EVALSHA\"") || lines[call].contains("\"EVAL\""),
        "{}",
        lines[call]
    );
    assert!(
        lines[end_at..exit_at]
            .iter()
            .any(|l| l.contains("\"HSET\"") && l.contains("\"result\"")),
        "the call that appended the stage end did not write the result: {:#?}",
        &lines[call..=exit_at]
    );
    world.assert_settled(&id).await;

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.assert_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_compiled_jobs_stages_are_streamed_in_order() {
    let world = World::new().await;
    // A C job: the catalog gives it a compile stage, then the run.
    let id = world
        .submit(&crate::common::job("c", "main.c", "print hello from c"))
        .await;
    let mut worker = world.start_worker(1, Duration::from_secs(30));

    let record = world.wait_terminal(&id, JOB_DEADLINE).await;
    assert_eq!(record.status, Status::Succeeded, "{record:#?}");
    let events = checked_stream(&world, &record).await;
    let result = record.result.as_ref().expect("a result");
    let stages: Vec<&JobEvent> = events
        .iter()
        .filter(|e| matches!(e, JobEvent::Stage { .. }))
        .collect();
    assert_eq!(
        stages,
        [
            &JobEvent::stage_start("compile"),
            &JobEvent::stage_end("compile", result.compile.as_ref().expect("compiled")),
            &JobEvent::stage_start("run"),
            &JobEvent::stage_end("run", result.run.as_ref().expect("ran")),
        ]
    );
    // The run's output is between the run's start and end.
    let run_start = events
        .iter()
        .position(|e| *e == JobEvent::stage_start("run"))
        .expect("run start");
    assert_eq!(
        events[run_start + 1..events.len() - 1],
        [JobEvent::stdout(b"hello from c\n".to_vec())]
    );
    world.assert_settled(&id).await;

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.assert_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_tiny_writes_is_coalesced() {
    let world = World::new().await;
    let id = world
        .submit(&scripted::job("repeat 20000\n  write x\nend"))
        .await;
    let mut worker = world.start_worker(1, Duration::from_secs(30));

    let record = world.wait_terminal(&id, JOB_DEADLINE).await;
    assert_eq!(record.status, Status::Succeeded, "{record:#?}");
    let events = checked_stream(&world, &record).await;
    let expected = "x".repeat(20_000);
    assert_eq!(run_stdout(&record), expected);
    assert_eq!(streamed_stdout(&events), expected.as_bytes());
    let count = output_events(&events);
    assert!(
        (1..500).contains(&count),
        "{count} output events for 20000 writes"
    );
    // And as few Redis commands: every script call of the whole test
    // (submit, start, the appends, finish).
    let calls = script_calls(&world).await;
    assert!(calls < 500, "{calls} script calls for 20000 writes");
    assert_eq!(events.first(), Some(&JobEvent::stage_start("run")));
    assert!(
        matches!(
            events.last(),
            Some(JobEvent::Stage {
                state: StageState::End,
                ..
            })
        ),
        "{:?}",
        events.last()
    );

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.assert_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streamed_output_stops_at_the_output_limit() {
    let world = World::new().await;
    let spec = JobSpec {
        limits: LimitsRequest {
            output_bytes: Some(1000),
            ..Default::default()
        },
        ..scripted::job("forever\n  write yyyyyyy\nend")
    };
    let id = world.submit(&spec).await;
    let mut worker = world.start_worker(1, Duration::from_secs(30));

    let record = world.wait_terminal(&id, JOB_DEADLINE).await;
    let events = checked_stream(&world, &record).await;
    let result = record.result.as_ref().expect("a result");
    let run = result.run.as_ref().expect("a run stage");
    assert_eq!(run.stdout.as_bytes(), "y".repeat(1000).as_bytes());
    assert_eq!(streamed_stdout(&events), "y".repeat(1000).as_bytes());
    assert_eq!(
        output_events(&events),
        events
            .iter()
            .filter(|e| matches!(e, JobEvent::Stdout { .. }))
            .count()
    );
    let end = events.last().expect("a stage end");
    assert_eq!(*end, JobEvent::stage_end("run", run));
    let JobEvent::Stage {
        state,
        truncated,
        reason,
        ..
    } = end
    else {
        panic!("{end:?}")
    };
    assert_eq!(*state, StageState::End);
    assert_eq!(*truncated, Some(true));
    assert_eq!(*reason, Some(code_runner::protocol::Reason::OutputLimit));

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.assert_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_events_stream_expires_with_the_job() {
    let world = World::new().await;
    let id = world.submit(&scripted::job("print soon gone")).await;
    let mut worker = world.start_worker(1, Duration::from_secs(30));

    let record = world.wait_terminal(&id, JOB_DEADLINE).await;
    assert_eq!(record.status, Status::Succeeded, "{record:#?}");
    let events = checked_stream(&world, &record).await;
    assert_eq!(streamed_stdout(&events), b"soon gone\n");
    // Both TTLs read at one instant (one MULTI), in milliseconds.
    let mut conn = world.redis.conn().await;
    let (ttl, job_ttl): (i64, i64) = redis::pipe()
        .atomic()
        .pttl(world.store.keys().events(&id))
        .pttl(world.store.keys().job(&id))
        .query_async(&mut conn)
        .await
        .expect("PTTL");
    assert!(
        (1..=3_600_000).contains(&ttl),
        "the events stream's TTL is {ttl} ms"
    );
    assert!(
        ttl.abs_diff(job_ttl) <= 1000,
        "the stream ({ttl} ms) and the job ({job_ttl} ms) expire together"
    );
    // Nothing is appended after the exit event, even by a late append.
    assert_eq!(
        world
            .store
            .jobs()
            .append_events(
                &id,
                world.worker_id(),
                1,
                &[JobEvent::stdout(b"late".to_vec())]
            )
            .await
            .expect("redis answers"),
        None
    );
    assert_eq!(
        stream_events(&world, &id).await.len(),
        events.len() + 3,
        "queued, running and exit around the middle"
    );

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.assert_clean().await;
}
