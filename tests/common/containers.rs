//! Docker for the test harnesses: a client, the containers that carry a
//! label, and their removal when a harness drops.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bollard::models::ContainerSummary;
use bollard::query_parameters::{ListContainersOptions, TopOptions};
use code_runner::sandbox::force_remove;

/// A Docker client that speaks the daemon's API version (dockerd 20.10 refuses
/// bollard's default version).
pub async fn docker() -> bollard::Docker {
    bollard::Docker::connect_with_defaults()
        .expect("docker client")
        .negotiate_version()
        .await
        .expect("dockerd must be running for the integration tests (scripts/test starts it)")
}

/// The containers (any state) with `label` (`key` or `key=value`).
pub async fn list_labelled(
    docker: &bollard::Docker,
    label: &str,
) -> Result<Vec<ContainerSummary>, bollard::errors::Error> {
    let filters = HashMap::from([("label".to_string(), vec![label.to_string()])]);
    let options = ListContainersOptions {
        all: true,
        filters: Some(filters),
        ..Default::default()
    };
    docker.list_containers(Some(options)).await
}

/// The rows of `docker top` (`ps -ef`) of a container, each joined by
/// spaces; none when it is not running (or gone).
pub async fn processes(docker: &bollard::Docker, container: &str) -> Vec<String> {
    let options = TopOptions {
        ps_args: "-ef".to_string(),
    };
    match docker.top_processes(container, Some(options)).await {
        Ok(top) => top
            .processes
            .unwrap_or_default()
            .iter()
            .map(|row| row.join(" "))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Whether a listed container is a sandbox holding a process: created or
/// running (an "exited", "removing" or "dead" one waits only for removal).
pub fn holds_a_sandbox(container: &ContainerSummary) -> bool {
    matches!(
        container.state.as_ref().map(|s| s.to_string()).as_deref(),
        Some("created" | "running" | "restarting" | "paused")
    )
}

/// Ids of the containers (any state) with `label` (`key` or `key=value`).
pub async fn containers_labelled(docker: &bollard::Docker, label: &str) -> Vec<String> {
    list_labelled(docker, label)
        .await
        .expect("docker lists containers")
        .into_iter()
        .filter_map(|c| c.id)
        .collect()
}

/// Waits (up to 10 s) until `leftovers` lists no container; fails the test
/// with `what` and their ids otherwise.
pub async fn assert_none_left(what: &str, leftovers: impl AsyncFn() -> Vec<String>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = leftovers().await;
        if left.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            panic!("{what}: {left:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Force-removes every container with `label` that `select` picks. Runs in
/// `Drop`, also when the test failed: from a thread and a runtime of its own,
/// because the test's runtime may be gone; errors are ignored.
pub fn remove_labelled(label: String, select: impl Fn(&ContainerSummary) -> bool + Send + 'static) {
    let _ = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        runtime.block_on(async move {
            let docker = bollard::Docker::connect_with_defaults()
                .ok()?
                .negotiate_version()
                .await
                .ok()?;
            for container in list_labelled(&docker, &label).await.ok()? {
                if select(&container)
                    && let Some(id) = container.id
                {
                    let _ = force_remove(&docker, &id).await;
                }
            }
            Some(())
        })
    })
    .join();
}

/// Writes `<worker id> <test>` to the file `CODE_RUNNER_TEST_WORKERS` names
/// (when set): `scripts/test` names the test a leftover container came from
/// by its `code-runner.worker` label.
pub fn note_worker(worker_id: &str) {
    use std::io::Write as _;
    let Ok(path) = std::env::var("CODE_RUNNER_TEST_WORKERS") else {
        return;
    };
    let binary = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|stem| {
            stem.rsplit_once('-')
                .map_or(stem.clone(), |(name, _)| name.to_string())
        })
        .unwrap_or_default();
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("?");
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
    {
        let _ = writeln!(file, "{worker_id} {binary}::{test}");
    }
}

/// Seconds a [`sweep_later`] waits before its second removal.
const SWEEP_DELAY_SECS: u32 = 3;

/// Removes, a few seconds from now and from a process of its own, every
/// container with `label` (`key=value`): the containers whose creation was
/// still on its way in dockerd when their creator was killed or its runtime
/// ended, which the removal at drop cannot see yet (dockerd finishes a
/// create whose client went away). The test's process does not wait for it;
/// when `CODE_RUNNER_TEST_SWEEPS` names a directory, the sweep holds a file
/// there while it runs, so that `scripts/test` can wait for the last ones
/// before it looks for leftovers.
pub fn sweep_later(label: &str) {
    use std::os::unix::process::CommandExt as _;
    let marker = std::env::var("CODE_RUNNER_TEST_SWEEPS").unwrap_or_default();
    let script = r#"
        marker=""
        if [ -n "$SWEEPS" ] && [ -d "$SWEEPS" ]; then marker="$SWEEPS/$$"; : > "$marker"; fi
        sleep "$DELAY"
        ids="$(docker ps -aq --filter "label=$LABEL")"
        [ -n "$ids" ] && docker rm -fv $ids
        [ -n "$marker" ] && rm -f "$marker"
        exit 0
    "#;
    let _ = std::process::Command::new("sh")
        .args(["-c", script])
        .env("SWEEPS", marker)
        .env("DELAY", SWEEP_DELAY_SECS.to_string())
        .env("LABEL", label)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        // Its own process group: a test runner ending the test's group
        // leaves the sweep to finish.
        .process_group(0)
        .spawn();
}

/// Per job id: (container id, started ns, died ns) of each of its containers.
type Lives = std::sync::Arc<std::sync::Mutex<HashMap<String, Vec<(String, i64, Option<i64>)>>>>;

/// Records, from Docker's event stream, when each job container started and
/// when it died, so a test can tell whether a job ever ran in two sandboxes
/// at once. Stops when dropped.
pub struct Lifetimes {
    seen: Lives,
    task: tokio::task::JoinHandle<()>,
}

impl Lifetimes {
    /// Starts recording job containers (label `code-runner.job`).
    pub async fn record(docker: &bollard::Docker) -> Self {
        use futures_util::StreamExt;
        let seen: Lives = Default::default();
        let filters = HashMap::from([
            ("type".to_string(), vec!["container".to_string()]),
            (
                "label".to_string(),
                vec![code_runner::sandbox::LABEL_JOB.to_string()],
            ),
            (
                "event".to_string(),
                vec!["start".to_string(), "die".to_string()],
            ),
        ]);
        let options = bollard::query_parameters::EventsOptionsBuilder::new()
            .filters(&filters)
            .build();
        let mut events = docker.events(Some(options));
        let recorder = std::sync::Arc::clone(&seen);
        let task = tokio::spawn(async move {
            while let Some(Ok(event)) = events.next().await {
                let Some(actor) = event.actor else { continue };
                let attributes = actor.attributes.unwrap_or_default();
                let (Some(id), Some(job), Some(time)) = (
                    actor.id,
                    attributes.get(code_runner::sandbox::LABEL_JOB).cloned(),
                    event.time_nano,
                ) else {
                    continue;
                };
                let mut seen = recorder.lock().unwrap();
                let lives = seen.entry(job).or_default();
                match event.action.as_deref() {
                    Some("start") => lives.push((id, time, None)),
                    Some("die") => {
                        if let Some(life) = lives.iter_mut().find(|l| l.0 == id && l.2.is_none()) {
                            life.2 = Some(time);
                        }
                    }
                    _ => {}
                }
            }
        });
        // The stream is open once Docker answered the request.
        tokio::time::sleep(Duration::from_millis(200)).await;
        Self { seen, task }
    }

    /// How many containers each job started in.
    pub fn starts(&self, job: &str) -> usize {
        self.seen.lock().unwrap().get(job).map_or(0, Vec::len)
    }

    /// The jobs that had two containers alive at once, described.
    pub fn overlaps(&self) -> Vec<String> {
        let seen = self.seen.lock().unwrap();
        let mut overlaps = Vec::new();
        for (job, lives) in seen.iter() {
            let mut lives = lives.clone();
            lives.sort_by_key(|l| l.1);
            for pair in lives.windows(2) {
                let (first, second) = (&pair[0], &pair[1]);
                if first.2.is_none_or(|died| died > second.1) {
                    overlaps.push(format!(
                        "job {job}: container {} (started {}, died {:?}) and {} (started {})",
                        first.0, first.1, first.2, second.0, second.1
                    ));
                }
            }
        }
        overlaps
    }
}

impl Drop for Lifetimes {
    fn drop(&mut self) {
        self.task.abort();
    }
}
