//! The containers of jobs that ended by themselves wait in a queue to be
//! removed, one at a time (not in the job's slot, not against the running
//! jobs), their supervisors idle with nothing of the job left running: the
//! removal still happens once the slots are free, soon after the job when
//! they are, and if the worker dies with containers queued, another
//! worker's reaper removes them.

mod common;

use std::time::Duration;

use bollard::query_parameters::TopOptions;
use common::containers::docker;
use common::daemon::{self, DaemonBuilder, Role, job_containers, sleeper};
use common::redis_server::RedisServer;
use common::wait_for;

const WITHIN: Duration = Duration::from_secs(60);
const QUICK: &str = "print('quick')";

/// A worker of two slots: one busy job makes it busy (half its slots).
fn two_slots(role: Role, redis: &RedisServer) -> DaemonBuilder {
    DaemonBuilder::new(role, redis)
        .env("CODE_RUNNER_WORKER_MAX_SANDBOXES", 2)
        .env("CODE_RUNNER_HEARTBEAT_INTERVAL_MS", 300)
        .env("CODE_RUNNER_HEARTBEAT_TTL_MS", 3000)
        .env("CODE_RUNNER_REAPER_INTERVAL_MS", 300)
        .env("CODE_RUNNER_REAPER_GRACE_MS", 0)
}

/// Submits a long job, then a quick one (`quick_source`, printing `quick`)
/// that ends while the long one runs; returns their ids once the quick one
/// has succeeded.
async fn quick_beside_long(
    server: &daemon::Daemon,
    long_secs: f64,
    quick_source: &str,
) -> (String, String) {
    let long = server.submit(&sleeper(long_secs)).await.id();
    server.wait_status(&long, &["running"], WITHIN).await;
    let quick = server.submit_wait(&daemon::python(quick_source)).await;
    assert_eq!(quick.status, 200, "{quick:#?}");
    assert_eq!(quick.body["status"], "succeeded", "{quick:#?}");
    (long, quick.id())
}

#[tokio::test]
async fn a_removal_waits_while_the_slots_are_busy_and_is_done_after() {
    let redis = RedisServer::start();
    let server = two_slots(Role::Serve, &redis).start().await;
    let docker = docker().await;
    let (long, quick) = quick_beside_long(&server, 4.0, QUICK).await;
    // The quick job's container waits its turn.
    server
        .wait_metric("code_runner_removals_queued", 1.0, WITHIN)
        .await;
    assert_eq!(job_containers(&docker, &quick).await.len(), 1);
    assert_eq!(server.job(&long).await["status"], "running");
    // Once the long job is over, both are removed.
    server.wait_terminal(&long, WITHIN).await;
    wait_for("both containers removed", WITHIN, || async {
        (job_containers(&docker, &quick).await.is_empty()
            && job_containers(&docker, &long).await.is_empty())
        .then_some(())
    })
    .await;
    server
        .wait_metric("code_runner_removals_queued", 0.0, WITHIN)
        .await;
}

#[tokio::test]
async fn removals_off_removes_in_the_slot_at_once() {
    let redis = RedisServer::start();
    let server = two_slots(Role::Serve, &redis)
        .env("CODE_RUNNER_YIELD_WHILE_BUSY", "off")
        .start()
        .await;
    let docker = docker().await;
    let (long, quick) = quick_beside_long(&server, 3.0, QUICK).await;
    wait_for("the quick job's container removed", WITHIN, || async {
        job_containers(&docker, &quick)
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    assert_eq!(server.job(&long).await["status"], "running");
    assert_eq!(
        daemon::metric(&server.metrics().await, "code_runner_removals_queued"),
        Some(0.0)
    );
}

#[tokio::test]
async fn queued_removals_of_a_dead_worker_are_reaped() {
    let redis = RedisServer::start();
    let mut doomed = two_slots(Role::Serve, &redis).start().await;
    let docker = docker().await;
    let (long, quick) = quick_beside_long(&doomed, 30.0, QUICK).await;
    doomed
        .wait_metric("code_runner_removals_queued", 1.0, WITHIN)
        .await;
    assert_eq!(job_containers(&docker, &quick).await.len(), 1);
    doomed.kill9().await;
    // Another worker's reaper finds the dead worker's containers: the queued
    // one and the long job's.
    let _reaper = two_slots(Role::Serve, &redis).start().await;
    wait_for("the dead worker's containers reaped", WITHIN, || async {
        (job_containers(&docker, &quick).await.is_empty()
            && job_containers(&docker, &long).await.is_empty())
        .then_some(())
    })
    .await;
}

/// The rows of `docker top` (`ps -ef`) of a container.
async fn processes(docker: &bollard::Docker, container: &str) -> Vec<String> {
    let options = TopOptions {
        ps_args: "-ef".to_string(),
    };
    let top = docker
        .top_processes(container, Some(options))
        .await
        .expect("docker top");
    top.processes
        .unwrap_or_default()
        .iter()
        .map(|row| row.join(" "))
        .collect()
}

#[tokio::test]
async fn a_queued_container_lingers_with_nothing_of_its_job_running() {
    let redis = RedisServer::start();
    let server = two_slots(Role::Serve, &redis).start().await;
    let docker = docker().await;
    // The quick job leaves a spinning process behind, in a session of its
    // own, deaf to SIGHUP and SIGTERM, a sleeping one, and files.
    let leaves_processes = "import subprocess\n\
        subprocess.Popen(['sh', '-c', 'trap \"\" HUP TERM; while :; do :; done'], start_new_session=True)\n\
        subprocess.Popen(['sleep', '1000'])\n\
        open('/tmp/left', 'w').write('x' * 1000000)\n\
        open('/dev/shm/left', 'w').write('x' * 1000000)\n\
        print('quick')";
    let (long, quick) = quick_beside_long(&server, 6.0, leaves_processes).await;
    server
        .wait_metric("code_runner_removals_queued", 1.0, WITHIN)
        .await;
    let containers = job_containers(&docker, &quick).await;
    assert_eq!(containers.len(), 1, "{containers:?}");
    // The container still runs (its exit waits for the removal), and
    // nothing but its supervisor is left in it.
    let inspect = docker
        .inspect_container(&containers[0], None)
        .await
        .expect("docker inspect");
    assert_eq!(inspect.state.and_then(|s| s.running), Some(true));
    let rows = processes(&docker, &containers[0]).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(
        rows[0].ends_with(" /usr/local/bin/code-runner-init"),
        "{rows:?}"
    );
    // Nor any of its files: not its program, not what it wrote.
    let listed = listing(&docker, &containers[0], &["/workspace", "/tmp", "/dev/shm"]).await;
    assert_eq!(listed, "/dev/shm:\n\n/tmp:\n\n/workspace:\n", "{listed}");
    assert_eq!(server.job(&long).await["status"], "running");
    server.wait_terminal(&long, WITHIN).await;
    wait_for("both containers removed", WITHIN, || async {
        (job_containers(&docker, &quick).await.is_empty()
            && job_containers(&docker, &long).await.is_empty())
        .then_some(())
    })
    .await;
}

#[tokio::test]
async fn with_the_slots_free_a_container_is_removed_soon_after_its_job() {
    let redis = RedisServer::start();
    let server = two_slots(Role::Serve, &redis).start().await;
    let docker = docker().await;
    let quick = server.submit_wait(&daemon::python(QUICK)).await;
    assert_eq!(quick.body["status"], "succeeded", "{quick:#?}");
    let id = quick.id();
    // Well within the supervisor's own linger (60 s): the queue ended it.
    wait_for("the container removed", Duration::from_secs(10), || async {
        job_containers(&docker, &id).await.is_empty().then_some(())
    })
    .await;
    assert_eq!(
        daemon::metric(&server.metrics().await, "code_runner_removals_queued"),
        Some(0.0)
    );
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
