//! A running job's input: stdin and signals a client writes to the job's
//! control stream reach it, through one control connection for all the
//! worker's jobs, which a job started mid-read wakes (the doorbell), which
//! outlives the server's idle timeout, and which reconnects and reads the
//! cancel flags again when it is killed; a flood of input to a program
//! that reads late arrives whole and in order.

use std::time::Duration;

use code_runner::job::Status;
use code_runner::job::events::JobEvent;
use redis::AsyncCommands;

use crate::common::scripted;
use crate::common::wait_for;
use crate::monitor::Monitor;
use crate::world::{
    JOB_DEADLINE, World, blocked_xreads, checked_stream, interactive, run_stdout, send_control,
    wait_for_stdout,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn live_stdin_and_signals_reach_the_running_job() {
    let world = World::new().await;
    let mut worker = world.start_worker(2, Duration::from_secs(30));

    // It ends only once its stdin is closed.
    let echo = world.submit(&interactive("echo upper")).await;
    world.wait_running(&echo).await;
    // Stdin is stored raw in the control stream.
    send_control(
        &world,
        &echo,
        &[("type", "stdin"), ("data", "hello, worker\n")],
    )
    .await;
    send_control(&world, &echo, &[("type", "stdin_close")]).await;
    world
        .assert_succeeded(&echo, "HELLO, WORKER\n", JOB_DEADLINE)
        .await;

    let sleeper = world
        .submit(&scripted::job(
            "trap SIGINT KeyboardInterrupt\nprint up\nsleep 30000",
        ))
        .await;
    world.wait_running(&sleeper).await;
    // Once its output is in the events stream the program runs, and one
    // interrupt reaches it.
    wait_for_stdout(&world, &sleeper, b"up\n").await;
    send_control(
        &world,
        &sleeper,
        &[("type", "signal"), ("signal", "interrupt")],
    )
    .await;
    let record = world.wait_terminal(&sleeper, Duration::from_secs(20)).await;
    assert_eq!(record.status, Status::Failed, "{record:#?}");
    let result = record.result.as_ref().expect("a result");
    let run = result.run.as_ref().expect("a run stage");
    assert!(
        crate::common::stderr(result).contains("KeyboardInterrupt"),
        "{result:#?}"
    );
    assert_eq!(run.reason, code_runner::protocol::Reason::Exited);
    let events = checked_stream(&world, &record).await;
    let streamed_stderr: Vec<u8> = events
        .iter()
        .filter(|e| matches!(e, JobEvent::Stderr { .. }))
        .flat_map(|e| e.output_bytes().expect("output decodes"))
        .collect();
    assert_eq!(streamed_stderr, run.stderr.as_bytes());
    world.assert_settled(&sleeper).await;

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.assert_clean().await;
    assert_eq!(world.processing_len().await, 0);
}

/// Appends stdin messages to the job's control stream in one round trip,
/// as the API would one by one.
async fn send_stdin_lines(world: &World, id: &str, lines: impl IntoIterator<Item = String>) {
    let mut conn = world.redis.conn().await;
    let mut pipe = redis::pipe();
    for line in lines {
        pipe.xadd(
            world.store.keys().stdin(id),
            "*",
            &[("type", "stdin"), ("data", line.as_str())],
        )
        .ignore();
    }
    let () = pipe.query_async(&mut conn).await.expect("XADD");
}

/// Four interactive jobs at once: one connection reads all their control
/// streams (not one each), and each job gets its own input, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn running_jobs_share_one_control_connection_and_each_gets_its_input() {
    let world = World::new().await;
    let mut worker = world.start_worker(4, Duration::from_secs(30));
    let spec = interactive("repeat 2\n  readline upper\nend");
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(world.submit(&spec).await);
    }
    for id in &ids {
        world.wait_running(id).await;
    }
    // Every job is followed once its relay runs; give the relays a moment
    // to start, then the reader's connection is the only one blocked.
    wait_for("one blocked control read", JOB_DEADLINE, || async {
        (blocked_xreads(&world).await.len() == 1).then_some(())
    })
    .await;
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(blocked_xreads(&world).await.len(), 1, "one control reader");
    }
    for round in ["first", "second"] {
        for (i, id) in ids.iter().enumerate() {
            let line = format!("{round} of job {i}\n");
            send_control(&world, id, &[("type", "stdin"), ("data", &line)]).await;
        }
    }
    for (i, id) in ids.iter().enumerate() {
        world
            .assert_succeeded(
                id,
                &format!("FIRST OF JOB {i}\nSECOND OF JOB {i}\n"),
                JOB_DEADLINE,
            )
            .await;
    }

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.assert_clean().await;
}

/// A job that starts while the control reader is blocked in its read
/// rings the worker's doorbell, and the read is issued again with the
/// job's stream (not only when the blocked read times out): MONITOR shows
/// the ring between the last read without the job's stream and the first
/// read with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_started_during_a_blocked_control_read_rings_the_doorbell() {
    let world = World::new().await;
    let mut worker = world.start_worker(4, Duration::from_secs(30));
    let spec = interactive("readline upper");
    let first = world.submit(&spec).await;
    world.wait_running(&first).await;
    wait_for("the control reader's read", JOB_DEADLINE, || async {
        (blocked_xreads(&world).await.len() == 1).then_some(())
    })
    .await;
    let monitor = Monitor::start(&world.redis).await;
    // A job followed in the instant between two reads needs no ring; each
    // of these starts while the reader is blocked (the one before it was
    // answered, and nothing else is sent), so at most the rare one does.
    let mut later = Vec::new();
    for i in 0..3 {
        let id = world.submit(&spec).await;
        world.wait_running(&id).await;
        send_control(
            &world,
            &id,
            &[("type", "stdin"), ("data", &format!("job {i}\n"))],
        )
        .await;
        wait_for_stdout(&world, &id, format!("JOB {i}\n").as_bytes()).await;
        later.push(id);
    }
    let lines = monitor.stop().await;
    let is_read = |line: &String| line.contains("\"XREAD\"") && line.contains(":doorbell\"");
    let is_ring = |line: &String| line.contains("\"XADD\"") && line.contains(":doorbell\"");
    let rung = later
        .iter()
        .filter(|id| {
            let stream = format!("\"{}\"", world.store.keys().stdin(id));
            let Some(first_read) = lines
                .iter()
                .position(|line| is_read(line) && line.contains(&stream))
            else {
                panic!("no read of {stream} in {lines:#?}");
            };
            let since = lines[..first_read]
                .iter()
                .rposition(is_read)
                .map_or(0, |read| read + 1);
            lines[since..first_read].iter().any(is_ring)
        })
        .count();
    assert!(
        rung >= 1,
        "no job's first read followed a ring of the doorbell: {lines:#?}"
    );
    send_control(&world, &first, &[("type", "stdin"), ("data", "first\n")]).await;
    for (id, stdout) in std::iter::once((&first, "FIRST\n".to_string())).chain(
        later
            .iter()
            .enumerate()
            .map(|(i, id)| (id, format!("JOB {i}\n"))),
    ) {
        world.assert_succeeded(id, &stdout, JOB_DEADLINE).await;
    }

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.assert_clean().await;
}

/// A server that closes idle clients (`timeout 2`) does not close the
/// control reader's connection between jobs: kept after the last job, it
/// stays blocked in a read of the doorbell, and the next job's input comes
/// on that same connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_control_connection_outlives_the_servers_idle_timeout_between_jobs() {
    let world = World::new().await;
    let mut conn = world.redis.conn().await;
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("timeout")
        .arg("2")
        .query_async(&mut conn)
        .await
        .expect("CONFIG SET timeout");
    let mut worker = world.start_worker(1, Duration::from_secs(30));
    let spec = interactive("readline upper");
    let mut reader = None;
    for (i, pause) in [Duration::ZERO, Duration::from_secs(5)]
        .into_iter()
        .enumerate()
    {
        tokio::time::sleep(pause).await;
        if let Some(reader) = &reader {
            assert_eq!(
                &blocked_xreads(&world).await,
                std::slice::from_ref(reader),
                "after {pause:?} without a job, the reader's connection is still blocked in its read"
            );
        }
        let id = world.submit(&spec).await;
        world.wait_running(&id).await;
        let line = format!("job {i}\n");
        send_control(&world, &id, &[("type", "stdin"), ("data", &line)]).await;
        world
            .assert_succeeded(&id, &format!("JOB {i}\n"), JOB_DEADLINE)
            .await;
        let blocked = wait_for("the control reader's read", JOB_DEADLINE, || async {
            blocked_xreads(&world).await.into_iter().next()
        })
        .await;
        assert_eq!(
            reader.get_or_insert_with(|| blocked.clone()),
            &blocked,
            "one connection for both jobs"
        );
    }

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.assert_clean().await;
}

/// The control reader's connection is killed mid-read: it connects
/// again, input still reaches its job, and a job whose cancel was asked
/// for (its `cancel_requested` flag, without the message) is cancelled,
/// as the flags are read again on every new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_control_reader_reconnects_and_reads_the_cancel_flags_again() {
    let world = World::new().await;
    let mut worker = world.start_worker(2, Duration::from_secs(30));
    let echo = world.submit(&interactive("readline upper")).await;
    let sleeper = world.submit(&scripted::job("print up\nsleep 60000")).await;
    world.wait_running(&echo).await;
    world.wait_running(&sleeper).await;
    wait_for_stdout(&world, &sleeper, b"up\n").await;
    let mut conn = world.redis.conn().await;
    let _: () = conn
        .hset(world.store.keys().job(&sleeper), "cancel_requested", "1")
        .await
        .expect("HSET");
    let reader = wait_for("the control reader's read", JOB_DEADLINE, || async {
        blocked_xreads(&world).await.into_iter().next()
    })
    .await;
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(&reader)
        .query_async(&mut conn)
        .await
        .expect("CLIENT KILL");
    assert_eq!(killed, 1);
    send_control(
        &world,
        &echo,
        &[("type", "stdin"), ("data", "after reconnect\n")],
    )
    .await;
    let record = world.wait_terminal(&echo, JOB_DEADLINE).await;
    assert_eq!(record.status, Status::Succeeded, "{record:#?}");
    assert_eq!(run_stdout(&record), "AFTER RECONNECT\n");
    let record = world.wait_terminal(&sleeper, JOB_DEADLINE).await;
    assert_eq!(record.status, Status::Cancelled, "{record:#?}");
    world.assert_settled(&echo).await;
    world.assert_settled(&sleeper).await;

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.assert_clean().await;
}

/// A program that reads its input late is sent far more messages than
/// the reader hands out before it waits: nothing is lost or reordered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_input_to_a_slow_reader_arrives_whole_and_in_order() {
    let world = World::new().await;
    let mut worker = world.start_worker(2, Duration::from_secs(30));
    // It reads nothing for 3 s, then copies all its input to stdout.
    let spec = interactive("print up\nsleep 3000\necho");
    let id = world.submit(&spec).await;
    world.wait_running(&id).await;
    wait_for_stdout(&world, &id, b"up\n").await;
    let lines: Vec<String> = (0..500).map(|i| format!("line {i}\n")).collect();
    send_stdin_lines(&world, &id, lines.clone()).await;
    send_control(&world, &id, &[("type", "stdin_close")]).await;
    world
        .assert_succeeded(&id, &format!("up\n{}", lines.concat()), JOB_DEADLINE)
        .await;

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.assert_clean().await;
}
