//! Warm sandboxes against the real dockerd: a sandbox serves exactly one
//! job, a job outside the pool's class goes cold with its own limits, a
//! broken or expired member is replaced, and every live sandbox has a uid of
//! its own (per-uid kernel limits are not shared). The daemon-level side
//! (the reaper and a killed worker's pool, the capacity schedule) is in the
//! `daemon` binary's `warm_capacity`.
//!
//! The hostile tests of the cold path run on the warm paths too: see the
//! `warm::` and `warm_runtime::` halves of [`limits`](crate::limits),
//! [`escape`](crate::escape) and [`runsc`](crate::runsc).

use crate::common;
use crate::jobs::memory_bomb;

use code_runner::sandbox::SandboxEngine as _;
use std::collections::BTreeSet;
use std::time::Duration;

use bollard::query_parameters::InspectContainerOptions;
use code_runner::job::{JobSpec, StartKind, Status};
use code_runner::protocol::Reason;
use code_runner::sandbox::pool::{LanguageStatus, PoolSettings, memory};
use code_runner::sandbox::{JobIo, SandboxEvent, WarmPool};
use common::{Harness, pool_settings, python, runsc_enabled, stdout, stdout_lines, wait_for};

const WITHIN: Duration = Duration::from_secs(60);

/// The names of this harness's warm containers (idle or claimed).
async fn warm_containers(harness: &Harness) -> BTreeSet<String> {
    harness
        .engine
        .list_sandboxes()
        .await
        .expect("docker lists containers")
        .into_iter()
        .filter(|c| c.worker == harness.worker_id && c.warm)
        .map(|c| c.id)
        .collect()
}

async fn two_jobs_never_share_a_sandbox(harness: Harness) {
    let first = harness.prepare(&python(
        "import os\nopen('/workspace/left-behind', 'w').write('x')\nopen('/tmp/left-behind', 'w').write('x')\nprint(os.getuid())",
    ));
    let second = harness.prepare(&python(
        "import os\nprint(os.path.exists('/workspace/left-behind'), os.path.exists('/tmp/left-behind'), os.listdir('/workspace'), os.getuid())",
    ));
    let pool = harness.warm_pool(&first, 2).await;
    let docker = harness.engine.docker();

    let warm = pool.claim(&first).await.expect("a ready sandbox");
    let one = harness
        .engine
        .run_job("job-one", &first, JobIo::default(), Some(warm))
        .await;
    assert_eq!(one.result.status, Status::Succeeded, "{:#?}", one.result);
    assert_eq!(one.result.start, Some(StartKind::Warm));
    let one_uid = stdout(&one.result);
    assert!(one.cleanup.remove().await);
    // Served once, then gone.
    let gone = docker
        .inspect_container(&one.container, None::<InspectContainerOptions>)
        .await;
    assert!(
        matches!(
            gone,
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404,
                ..
            })
        ),
        "the first job's sandbox still exists: {gone:?}"
    );

    let warm = pool.claim(&second).await.expect("another ready sandbox");
    let two = harness
        .engine
        .run_job("job-two", &second, JobIo::default(), Some(warm))
        .await;
    assert_eq!(two.result.status, Status::Succeeded, "{:#?}", two.result);
    assert_eq!(two.result.start, Some(StartKind::Warm));
    assert_ne!(two.container, one.container, "a sandbox served two jobs");
    let line = stdout(&two.result);
    assert!(
        line.starts_with("False False ['main.py'] "),
        "the second job saw the first one's files: {line:?}"
    );
    // Two sandboxes alive at the same time never share a uid.
    assert_ne!(line.trim().rsplit(' ').next(), Some(one_uid.trim()));
    assert!(two.cleanup.remove().await);
    pool.shutdown(WITHIN).await;
    harness.assert_clean().await;
}

#[tokio::test]
async fn two_jobs_never_share_a_sandbox_under_runc() {
    two_jobs_never_share_a_sandbox(Harness::new().await).await;
}

#[tokio::test]
async fn two_jobs_never_share_a_sandbox_under_runsc() {
    if !runsc_enabled() {
        println!("runsc tests are skipped (CODE_RUNNER_TEST_RUNSC is not 1)");
        return;
    }
    two_jobs_never_share_a_sandbox(Harness::with_runtime(Some("runsc")).await).await;
}

#[tokio::test]
async fn a_job_outside_the_pools_class_runs_cold_with_its_own_limits() {
    let harness = Harness::new().await;
    let default_class = harness.prepare(&python("print(1)"));
    let pool = harness.warm_pool(&default_class, 1).await;

    // 64 MiB instead of the default: the pool's sandboxes are bigger, so
    // this job may not have one.
    let bomb = harness.prepare(&memory_bomb(64));
    assert!(
        pool.claim(&bomb).await.is_none(),
        "a bigger sandbox was given"
    );
    let outcome = harness
        .engine
        .run_job("bomb", &bomb, JobIo::default(), None)
        .await;
    let result = &outcome.result;
    assert_eq!(result.start, Some(StartKind::Cold));
    assert_eq!(result.status, Status::Failed, "{result:#?}");
    assert_eq!(result.run.as_ref().unwrap().reason, Reason::MemoryLimit);
    assert!(outcome.cleanup.remove().await);
    // The pool's sandbox is still there for a job of its class.
    assert_eq!(pool.status().borrow().ready(), 1);
    assert!(pool.claim(&default_class).await.is_some());
    pool.shutdown(WITHIN).await;
    harness.assert_clean().await;
}

#[tokio::test]
async fn a_broken_or_expired_warm_sandbox_is_replaced() {
    let harness = Harness::new().await;
    let job = harness.prepare(&python("print(1)"));
    let one_at_a_time = PoolSettings {
        longest_job: Duration::from_secs(60),
        parallel_starts: 1,
        ..pool_settings(1)
    };
    let pool = WarmPool::start(&harness.engine, one_at_a_time.clone());
    pool.set_targets(vec![(harness.warm_spec(&job), 1)]);
    let first = wait_for("a warm sandbox", WITHIN, || async {
        let ids = warm_containers(&harness).await;
        (pool.status().borrow().ready() == 1 && ids.len() == 1).then_some(ids)
    })
    .await;
    // Killed from outside (as when dockerd restarts): replaced.
    let id = first.iter().next().unwrap().clone();
    harness
        .engine
        .docker()
        .kill_container(&id, None::<bollard::query_parameters::KillContainerOptions>)
        .await
        .expect("docker kills the container");
    let second = wait_for("a replacement", WITHIN, || async {
        let ids = warm_containers(&harness).await;
        (pool.status().borrow().ready() == 1 && ids.len() == 1 && ids != first).then_some(ids)
    })
    .await;
    assert!(second.is_disjoint(&first));
    pool.shutdown(WITHIN).await;
    harness.assert_clean().await;

    // A member older than its lifetime is replaced too.
    let pool = WarmPool::start(
        &harness.engine,
        PoolSettings {
            lifetime: Duration::from_secs(2),
            ..one_at_a_time
        },
    );
    pool.set_targets(vec![(harness.warm_spec(&job), 1)]);
    let young = wait_for("a warm sandbox", WITHIN, || async {
        let ids = warm_containers(&harness).await;
        (pool.status().borrow().ready() == 1 && ids.len() == 1).then_some(ids)
    })
    .await;
    wait_for("the expired one replaced", WITHIN, || async {
        let ids = warm_containers(&harness).await;
        (pool.status().borrow().ready() == 1 && ids.len() == 1 && ids.is_disjoint(&young))
            .then_some(())
    })
    .await;
    // A lowered target retires the surplus.
    pool.set_targets(vec![]);
    wait_for("the pool emptied", WITHIN, || async {
        warm_containers(&harness).await.is_empty().then_some(())
    })
    .await;
    assert_eq!(pool.status().borrow().ready(), 0);
    pool.shutdown(WITHIN).await;
    harness.assert_clean().await;
}

/// The pool starts no sandbox while the machine has less memory available
/// than its reserve, and says so in its status; with a reserve the machine
/// has, it fills.
#[tokio::test]
async fn a_pool_starts_nothing_while_less_memory_than_its_reserve_is_available() {
    let harness = Harness::new().await;
    let job = harness.prepare(&python("print(1)"));
    let settings = |memory_reserve| PoolSettings {
        longest_job: Duration::from_secs(60),
        memory_reserve,
        ..pool_settings(2)
    };
    let short = WarmPool::start(&harness.engine, settings(u64::MAX));
    short.set_targets(vec![(harness.warm_spec(&job), 2)]);
    wait_for("the pool waiting for memory", WITHIN, || async {
        short.status().borrow().memory_held.then_some(())
    })
    .await;
    // Looked at again (every second) meanwhile: still nothing started.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let status = short.status().borrow().clone();
    assert!(status.memory_held);
    assert_eq!(
        status.languages["python"],
        LanguageStatus {
            target: 2,
            ready: 0,
            creating: 0
        }
    );
    assert!(warm_containers(&harness).await.is_empty());
    assert!(short.claim(&job).await.is_none());
    short.shutdown(WITHIN).await;

    let available = memory::machine_bytes("MemAvailable").expect("/proc/meminfo");
    let enough = WarmPool::start(&harness.engine, settings(available / 4));
    enough.set_targets(vec![(harness.warm_spec(&job), 2)]);
    wait_for("the pool filled", WITHIN, || async {
        let status = enough.status().borrow().clone();
        (status.ready() == 2).then_some(())
    })
    .await;
    assert!(!enough.status().borrow().memory_held);
    assert_eq!(warm_containers(&harness).await.len(), 2);
    enough.shutdown(WITHIN).await;
    harness.assert_clean().await;
}

/// Two jobs at once: the first uses up the per-uid inotify instance limit
/// (`fs.inotify.max_user_instances`, counted per uid across every container
/// of the host) and holds it; the second, running meanwhile, can still make
/// one. With one uid for every sandbox it would get EMFILE.
async fn per_uid_limits_of_one_job_do_not_affect_another(harness: Harness) {
    let hog = JobSpec {
        interactive: true,
        ..python(
            "import ctypes, os, sys\nlibc = ctypes.CDLL(None, use_errno=True)\nfds = []\nwhile True:\n    fd = libc.inotify_init1(0)\n    if fd < 0:\n        break\n    fds.append(fd)\nprint(os.getuid(), len(fds), os.strerror(ctypes.get_errno()), flush=True)\nsys.stdin.read()\n",
        )
    };
    let neighbour = python(
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nfd = libc.inotify_init1(0)\nprint(os.getuid(), 'ok' if fd >= 0 else os.strerror(ctypes.get_errno()))",
    );
    let (events, mut events_rx) = tokio::sync::mpsc::channel(16);
    let (input, input_rx) = tokio::sync::mpsc::channel(4);
    let io = JobIo {
        events: Some(events),
        input: Some(input_rx),
        ..Default::default()
    };
    let hogging = harness.run_io(&hog, io);
    let rest = async {
        let mut printed = Vec::new();
        while let Some(event) = events_rx.recv().await {
            if let SandboxEvent::Stdout(data) = event {
                printed.extend(data);
                if printed.ends_with(b"\n") {
                    break;
                }
            }
        }
        let hog_line = String::from_utf8_lossy(&printed).into_owned();
        // While the hog holds every instance its uid may have:
        let result = harness.run(&neighbour).await;
        input
            .send(code_runner::sandbox::JobInput::StdinClose)
            .await
            .expect("the hog still runs");
        (hog_line, result)
    };
    let (hog_result, (hog_line, neighbour_result)) = tokio::join!(hogging, rest);
    assert_eq!(hog_result.status, Status::Succeeded, "{hog_result:#?}");
    let fields: Vec<&str> = hog_line.split_whitespace().collect();
    assert!(
        fields.len() >= 3 && fields[2..].join(" ") == "Too many open files",
        "the hog did not reach the per-uid limit: {hog_line:?}"
    );
    let held: u64 = fields[1].parse().unwrap();
    assert!(held >= 1, "{hog_line:?}");
    assert_eq!(
        neighbour_result.status,
        Status::Succeeded,
        "{neighbour_result:#?}"
    );
    let lines = stdout_lines(&neighbour_result);
    let neighbour_fields: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        neighbour_fields[1], "ok",
        "the neighbour was starved by the hog's uid: {lines:?} / {hog_line:?}"
    );
    assert_ne!(
        neighbour_fields[0], fields[0],
        "two live sandboxes shared a uid"
    );
    harness.assert_clean().await;
}

#[tokio::test]
async fn per_uid_limits_of_one_job_do_not_affect_another_cold() {
    per_uid_limits_of_one_job_do_not_affect_another(Harness::new().await).await;
}

#[tokio::test]
async fn per_uid_limits_of_one_job_do_not_affect_another_warm() {
    per_uid_limits_of_one_job_do_not_affect_another(Harness::new().await.on(StartKind::Warm)).await;
}

/// A pool's shutdown removes its idle members itself, and returns only once
/// they are gone, no more than `DISCARDS_IN_FLIGHT` at once: Docker handed
/// hundreds of forced removals at once (a pool of 300 stopping on 2 CPUs,
/// each left to its guard's drop) handled some exits after it had begun
/// deleting the container, which then stayed listed as "Removal In
/// Progress" until dockerd restarted. Watched through Docker's own events:
/// a member is in flight from its `kill` to its `destroy`. (Docker reports
/// `kill`, `die`, `destroy` for a forced removal too: the order is checked,
/// but it is the bound and the wait that tell the two paths apart.)
#[tokio::test]
async fn a_pools_shutdown_removes_a_bounded_number_of_members_at_once() {
    use bollard::query_parameters::EventsOptions;
    use code_runner::sandbox::pool::DISCARDS_IN_FLIGHT;
    use futures_util::StreamExt;

    let harness = Harness::new().await;
    let job = harness.prepare(&python("print(1)"));
    let members = DISCARDS_IN_FLIGHT + 6;
    let pool = harness.warm_pool(&job, members).await;
    assert_eq!(warm_containers(&harness).await.len(), members);

    // Docker replays what happened since `since`, so no event of the
    // shutdown is missed however late the stream is first read.
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let filters = std::collections::HashMap::from([
        ("type".to_string(), vec!["container".to_string()]),
        (
            "label".to_string(),
            vec![format!("code-runner.worker={}", harness.worker_id)],
        ),
        (
            "event".to_string(),
            vec!["kill".to_string(), "die".to_string(), "destroy".to_string()],
        ),
    ]);
    let mut events = harness.engine.docker().events(Some(EventsOptions {
        since: Some(format!("{}.{:09}", since.as_secs(), since.subsec_nanos())),
        filters: Some(filters),
        ..Default::default()
    }));
    // Per container: the actions in the order Docker reported them; and
    // the most members between their `kill` and their `destroy` at once.
    let watch = tokio::spawn(async move {
        let mut seen: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        let (mut in_flight, mut most, mut destroyed) = (0usize, 0usize, 0);
        while destroyed < members {
            let event = tokio::time::timeout(WITHIN, events.next())
                .await
                .expect("every member is destroyed within 60 s")
                .expect("docker's event stream stays open")
                .expect("docker sends events");
            let id = event
                .actor
                .and_then(|a| a.id)
                .expect("an event names its container");
            let action = event.action.expect("an event has an action");
            let actions = seen.entry(id).or_default();
            match action.as_str() {
                "kill" if !actions.iter().any(|a| a == "kill") => {
                    in_flight += 1;
                    most = most.max(in_flight);
                }
                "destroy" => {
                    in_flight -= 1;
                    destroyed += 1;
                }
                _ => {}
            }
            actions.push(action);
        }
        (seen, most)
    });

    pool.shutdown(WITHIN).await;
    // The shutdown waited for its members: none is left the moment it
    // returns (left to a guard's drop, they were all still there).
    assert_eq!(harness.leftovers().await, Vec::<String>::new());
    let (seen, most) = watch.await.expect("the events are read");

    assert_eq!(seen.len(), members, "{seen:#?}");
    for (id, actions) in &seen {
        let position = |name: &str| actions.iter().position(|a| a == name);
        let (kill, die, destroy) = (position("kill"), position("die"), position("destroy"));
        assert!(
            kill.is_some() && kill < die && die < destroy,
            "{id}: not killed, stopped, then removed: {actions:?}"
        );
    }
    assert!(
        most <= DISCARDS_IN_FLIGHT,
        "{most} members were being removed at once (at most {DISCARDS_IN_FLIGHT})"
    );
    assert!(most >= 2, "the members were removed one at a time: {most}");
    harness.assert_clean().await;
}
