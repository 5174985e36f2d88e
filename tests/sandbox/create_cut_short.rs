//! A job dropped while Docker is still creating its container leaves no
//! container: the removal waits for the creation. Docker is reached
//! through a proxy on a Unix socket that holds every create request for a
//! few seconds, longer than any fixed retry would wait.
//!
//! It points `DOCKER_HOST` at the proxy while its engine connects, which
//! would reach any other test of the process: it needs a process of its own,
//! as cargo-nextest gives every test (under plain `cargo test`, run it
//! alone: `cargo test --test sandbox create_cut_short`).

use crate::common;
use crate::jobs::sleep_forever;

use code_runner::sandbox::SandboxEngine as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use code_runner::sandbox::JobIo;
use common::Harness;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;

/// How long the proxy holds a create request before Docker sees it.
const CREATE_DELAY: Duration = Duration::from_secs(4);

/// What the proxy saw of the create request.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    /// A create request came (and is being held).
    Held,
    /// Docker answered it.
    Answered,
}

/// A proxy in front of dockerd's socket that holds create requests.
struct SlowCreates {
    path: PathBuf,
    _dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl SlowCreates {
    fn start(upstream: &Path, seen: mpsc::UnboundedSender<Seen>) -> Self {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("docker.sock");
        let listener = UnixListener::bind(&path).expect("the proxy listens");
        let upstream = upstream.to_path_buf();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                let seen = seen.clone();
                tokio::spawn(async move {
                    if let Ok(docker) = UnixStream::connect(&upstream).await {
                        relay(client, docker, seen).await;
                    }
                });
            }
        });
        Self {
            path,
            _dir: dir,
            task,
        }
    }
}

impl Drop for SlowCreates {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies both ways; a chunk from the client with a create request in it
/// waits CREATE_DELAY, and the first answer after it is reported. The
/// forwarding goes on when the client has gone (as a request Docker had
/// already read would).
async fn relay(client: UnixStream, docker: UnixStream, seen: mpsc::UnboundedSender<Seen>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut docker_read, mut docker_write) = docker.into_split();
    let held = Arc::new(AtomicBool::new(false));
    let answered = Arc::clone(&held);
    let answers_seen = seen.clone();
    let answers = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = docker_read.read(&mut buf).await {
            if n == 0 {
                break;
            }
            if answered.swap(false, Ordering::SeqCst) {
                let _ = answers_seen.send(Seen::Answered);
            }
            // The client may be gone; the answer is still read.
            let _ = client_write.write_all(&buf[..n]).await;
        }
    });
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n) = client_read.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let chunk = &buf[..n];
        if chunk.starts_with(b"POST ") && contains(chunk, b"/containers/create") {
            let _ = seen.send(Seen::Held);
            tokio::time::sleep(CREATE_DELAY).await;
            held.store(true, Ordering::SeqCst);
        }
        if docker_write.write_all(chunk).await.is_err() {
            break;
        }
    }
    let _ = answers.await;
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

async fn next(seen: &mut mpsc::UnboundedReceiver<Seen>) -> Seen {
    tokio::time::timeout(Duration::from_secs(60), seen.recv())
        .await
        .expect("the proxy reports within 60 s")
        .expect("the proxy runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_dropped_while_its_container_is_being_created_leaves_no_container() {
    let (seen_tx, mut seen) = mpsc::unbounded_channel();
    let proxy = SlowCreates::start(Path::new("/var/run/docker.sock"), seen_tx);
    // SAFETY: the only test of its process (see the module's doc), before
    // its engine's threads read the environment; taken back once the engine
    // is connected, so the harness's cleanup (the docker CLI) goes to
    // dockerd itself.
    unsafe { std::env::set_var("DOCKER_HOST", format!("unix://{}", proxy.path.display())) };
    let harness = Harness::new().await;
    unsafe { std::env::remove_var("DOCKER_HOST") };

    let job = harness.prepare(&sleep_forever());
    let engine = harness.engine.clone();
    let task = tokio::spawn(async move {
        engine
            .run(&uuid::Uuid::new_v4().to_string(), &job, JobIo::default())
            .await
    });
    assert_eq!(next(&mut seen).await, Seen::Held);
    task.abort();
    let ended = task.await;
    assert!(
        ended.as_ref().is_err_and(|e| e.is_cancelled()),
        "the run ended by itself: {ended:?}"
    );
    // Docker creates the container only now, after the job's future is
    // gone; the job's own deadline is two minutes away, so only the
    // guard's removal can take it within assert_clean's 10 s.
    assert_eq!(next(&mut seen).await, Seen::Answered);
    harness.assert_clean().await;
}
