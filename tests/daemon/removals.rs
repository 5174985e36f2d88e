//! The containers of jobs that ended by themselves wait in a queue to be
//! removed, one at a time (not in the job's slot, not against the running
//! jobs): a warm sandbox's supervisor idles there with nothing of the job
//! left, neither process nor file; a cold job's container has exited. The
//! removal still happens once the slots are free, soon after the job when
//! they are, and if the worker dies with containers queued, another
//! worker's reaper removes them.
//!
//! Real containers of the real binary: what is left in them, and when
//! they exit. The queue's own rules on sandboxes that exited (removals
//! waiting while the slots are busy, removals off) are tested on the
//! scripted engine in `tests/worker` (`removals`).

use std::time::Duration;

use crate::common::containers::{docker, list_labelled, processes};
use crate::common::daemon::{self, DaemonBuilder, Role, job_containers, sleeper};
use crate::common::redis_server::RedisServer;
use crate::common::wait_for;
use bollard::models::ContainerSummary;
use code_runner::sandbox::LABEL_WORKER;

const WITHIN: Duration = Duration::from_secs(60);
const QUICK: &str = "print('quick')";
const QUEUED: &str = "code_runner_removals_queued";
const WARM_READY: &str = "code_runner_warm_ready{language=\"python\"}";

/// A worker of two slots and a warm pool of two python sandboxes: one busy
/// job makes it busy (half its slots).
fn two_slots(role: Role, redis: &RedisServer) -> DaemonBuilder {
    two_cold_slots(role, redis)
        .env("CODE_RUNNER_WARM", "python=2")
        .env("CODE_RUNNER_WARM_MAX", 2)
}

/// The same worker without a warm pool.
fn two_cold_slots(role: Role, redis: &RedisServer) -> DaemonBuilder {
    DaemonBuilder::new(role, redis)
        .env("CODE_RUNNER_WORKER_MAX_SANDBOXES", 2)
        .env("CODE_RUNNER_HEARTBEAT_INTERVAL_MS", 300)
        .env("CODE_RUNNER_HEARTBEAT_TTL_MS", 3000)
        .env("CODE_RUNNER_REAPER_INTERVAL_MS", 300)
        .env("CODE_RUNNER_REAPER_GRACE_MS", 0)
}

/// Submits a long job, then a quick one (`quick_source`, printing `quick`)
/// that ends while the long one runs; returns their ids once the quick one
/// has succeeded. With a warm pool of two (`warm`, as the server was
/// started: its metrics may not show the pool yet), both start warm.
async fn quick_beside_long(
    server: &daemon::Daemon,
    warm: bool,
    long_secs: f64,
    quick_source: &str,
) -> (String, String) {
    if warm {
        server.wait_metric(WARM_READY, 2.0, WITHIN).await;
    }
    let long = server.submit(&sleeper(long_secs)).await.id();
    server.wait_status(&long, &["running"], WITHIN).await;
    let quick = server.submit_wait(&daemon::python(quick_source)).await;
    assert_eq!(quick.status, 200, "{quick:#?}");
    assert_eq!(quick.body["status"], "succeeded", "{quick:#?}");
    let start = if warm { "warm_runtime" } else { "cold" };
    assert_eq!(quick.body["result"]["start"], start, "{quick:#?}");
    (long, quick.id())
}

/// [`quick_beside_long`] on a server with a warm pool, then waits until the
/// quick job's container is queued; returns the long job's id and the
/// containers whose supervisor is idle (at least one: the quick job's; a
/// refill starting may show its supervisor alone too, for a moment).
async fn queued_beside_long(
    server: &daemon::Daemon,
    docker: &bollard::Docker,
    long_secs: f64,
    quick_source: &str,
) -> (String, Vec<String>) {
    let (long, _quick) = quick_beside_long(server, true, long_secs, quick_source).await;
    server.wait_metric(QUEUED, 1.0, WITHIN).await;
    let idle = idle_supervisors(docker, &server.worker_id).await;
    assert!(!idle.is_empty());
    (long, idle)
}

/// The long job still runs (so the queued container waited for it); once
/// it is over, the queued container is removed.
async fn removed_after(server: &daemon::Daemon, docker: &bollard::Docker, long: &str) {
    assert_eq!(server.job(long).await["status"], "running");
    server.wait_terminal(long, WITHIN).await;
    wait_removed(server, docker, WITHIN).await;
}

/// Every container of the worker (a warm sandbox has no job label).
async fn worker_containers(docker: &bollard::Docker, worker_id: &str) -> Vec<ContainerSummary> {
    list_labelled(docker, &format!("{LABEL_WORKER}={worker_id}"))
        .await
        .expect("docker lists containers")
}

/// Waits until the worker's removal queue is empty and none of its
/// containers has an idle supervisor.
async fn wait_removed(server: &daemon::Daemon, docker: &bollard::Docker, within: Duration) {
    wait_for("the queued containers removed", within, || async {
        let text = server.metrics().await;
        (daemon::metric(&text, QUEUED) == Some(0.0)
            && idle_supervisors(docker, &server.worker_id).await.is_empty())
        .then_some(())
    })
    .await;
}

/// The worker's running containers in which nothing but the supervisor runs.
async fn idle_supervisors(docker: &bollard::Docker, worker_id: &str) -> Vec<String> {
    let mut idle = Vec::new();
    for container in worker_containers(docker, worker_id).await {
        let id = container.id.unwrap_or_default();
        let rows = processes(docker, &id).await;
        if rows.len() == 1 && rows[0].ends_with(" /usr/local/bin/code-runner-init") {
            idle.push(id);
        }
    }
    idle
}

#[tokio::test]
async fn a_removal_waits_while_the_slots_are_busy_and_is_done_after() {
    let redis = RedisServer::start();
    let server = two_slots(Role::Serve, &redis).start().await;
    let docker = docker().await;
    let (long, _idle) = queued_beside_long(&server, &docker, 4.0, QUICK).await;
    removed_after(&server, &docker, &long).await;
}

#[tokio::test]
async fn a_queued_container_keeps_nothing_of_its_job() {
    let redis = RedisServer::start();
    let server = two_slots(Role::Serve, &redis).start().await;
    let docker = docker().await;
    // The quick job leaves a spinning process behind, in a session of its
    // own, deaf to SIGHUP and SIGTERM, a sleeping one, and files.
    let leaves_behind = "import subprocess\n\
        subprocess.Popen(['sh', '-c', 'trap \"\" HUP TERM; while :; do :; done'], start_new_session=True)\n\
        subprocess.Popen(['sleep', '1000'])\n\
        open('/tmp/left', 'w').write('x' * 1000000)\n\
        open('/dev/shm/left', 'w').write('x' * 1000000)\n\
        print('quick')";
    // Its container still runs (its exit waits for the removal), with
    // nothing but its supervisor in it: no process of the job anywhere in
    // the worker's containers, none of its files. (A refill's supervisor,
    // alone for a moment, has empty directories as well.) The supervisor
    // empties the directories right after it reports the job done, which
    // may be a moment after the container is queued: a second is allowed.
    let (long, idle) = queued_beside_long(&server, &docker, 6.0, leaves_behind).await;
    const EMPTY: &str = "/dev/shm:\n\n/tmp:\n\n/workspace:\n";
    for container in &idle {
        let listed = crate::common::until(
            Duration::from_secs(1),
            || listing(&docker, container, &["/workspace", "/tmp", "/dev/shm"]),
            |listed: &String| listed == EMPTY,
        )
        .await;
        assert_eq!(listed, EMPTY, "{listed}");
    }
    for container in worker_containers(&docker, &server.worker_id).await {
        let rows = processes(&docker, container.id.as_deref().unwrap_or_default()).await;
        assert!(
            !rows
                .iter()
                .any(|r| r.contains("sleep 1000") || r.contains("while :")),
            "{rows:?}"
        );
    }
    removed_after(&server, &docker, &long).await;
}

#[tokio::test]
async fn with_the_slots_free_a_container_is_removed_soon_after_its_job() {
    let redis = RedisServer::start();
    let server = two_slots(Role::Serve, &redis).start().await;
    let docker = docker().await;
    server.wait_metric(WARM_READY, 2.0, WITHIN).await;
    let quick = server.submit_wait(&daemon::python(QUICK)).await;
    assert_eq!(quick.body["status"], "succeeded", "{quick:#?}");
    assert_eq!(quick.body["result"]["start"], "warm_runtime", "{quick:#?}");
    // Well within the supervisor's own linger (60 s): the queue ended it.
    wait_removed(&server, &docker, Duration::from_secs(10)).await;
}

#[tokio::test]
async fn a_cold_jobs_container_exits_by_itself_and_then_waits_its_turn() {
    let redis = RedisServer::start();
    let server = two_cold_slots(Role::Serve, &redis).start().await;
    let docker = docker().await;
    let (long, quick) = quick_beside_long(&server, false, 4.0, QUICK).await;
    server.wait_metric(QUEUED, 1.0, WITHIN).await;
    // Only a warm sandbox's supervisor lingers: this one had exited before
    // its container was queued.
    let containers = job_containers(&docker, &quick).await;
    assert_eq!(containers.len(), 1, "{containers:?}");
    let inspect = docker
        .inspect_container(&containers[0], None)
        .await
        .expect("docker inspect");
    let state = inspect.state.expect("a state");
    assert_eq!(state.running, Some(false), "{state:?}");
    assert_eq!(state.exit_code, Some(0), "{state:?}");
    server.wait_terminal(&long, WITHIN).await;
    wait_for("both containers removed", WITHIN, || async {
        (job_containers(&docker, &quick).await.is_empty()
            && job_containers(&docker, &long).await.is_empty())
        .then_some(())
    })
    .await;
}

#[tokio::test]
async fn queued_removals_of_a_dead_worker_are_reaped() {
    let redis = RedisServer::start();
    let mut doomed = two_slots(Role::Serve, &redis).start().await;
    let docker = docker().await;
    let doomed_id = doomed.worker_id.clone();
    queued_beside_long(&doomed, &docker, 30.0, QUICK).await;
    doomed.kill9().await;
    // Another worker's reaper finds the dead worker's containers: the queued
    // one, the long job's and its warm pool's.
    let _reaper = two_cold_slots(Role::Serve, &redis).start().await;
    wait_for("the dead worker's containers reaped", WITHIN, || async {
        worker_containers(&docker, &doomed_id)
            .await
            .is_empty()
            .then_some(())
    })
    .await;
}

/// What `ls -A DIRS` prints in a running container (`docker exec`).
async fn listing(docker: &bollard::Docker, container: &str, dirs: &[&str]) -> String {
    use bollard::exec::{CreateExecOptions, StartExecResults};
    use futures_util::StreamExt;
    let mut cmd = vec!["ls", "-A"];
    cmd.extend(dirs);
    let exec = docker
        .create_exec(
            container,
            CreateExecOptions {
                cmd: Some(cmd),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                ..Default::default()
            },
        )
        .await
        .expect("docker exec");
    let StartExecResults::Attached { mut output, .. } = docker
        .start_exec(&exec.id, None)
        .await
        .expect("docker exec starts")
    else {
        panic!("the exec did not attach");
    };
    let mut text = String::new();
    while let Some(chunk) = output.next().await {
        text.push_str(&chunk.expect("the exec's output").to_string());
    }
    text
}
