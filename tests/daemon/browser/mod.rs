//! The playground and the dashboard in a real browser: headless Chromium
//! (Debian's `chromium` and `chromium-driver`) driven by Selenium (Debian's
//! `python3-selenium`, run by `/usr/bin/python3`) through
//! `tests/daemon/browser/pages.py`, against real `code-runner serve` processes, each
//! with its own redis-server, running real sandboxes.
//!
//! Two daemons: one whose playground (at `/`) asks for a key and whose
//! dashboard the operator's key of `scripts/up` opens, and one with a shared playground key (at
//! `/playground`). `pages.py` checks every state of the pages (the page
//! loads with no console error, a Python hello world, every language's
//! hello-world template, an interactive
//! program fed two typed lines, Stop ending a loop with `killed`, a compile
//! error, a wrong key, each tab of the shared playground one user across
//! its runs — read back through the API and the run history —, the Tests
//! panel grading two tests live (one accepted, one a wrong answer with its
//! difference), a compile error, a refused test, the float check with
//! stop-on-failure and Stop there, the
//! dashboard with a running job, and a worker whose warm pool waits for
//! memory) and saves a
//! screenshot of each under `target/browser-screenshots/`.
//!
//! `CODE_RUNNER_TEST_FIREFOX=1 scripts/test` runs the same pages in Firefox ESR too
//! (Debian's `firefox-esr`, with a `geckodriver` on the PATH or in
//! `CODE_RUNNER_GECKODRIVER`). Debian has no geckodriver package:
//! `scripts/install-firefox` installs firefox-esr and builds a pinned
//! geckodriver from crates.io, which takes minutes, so CI runs Chromium only.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::daemon::{ChildGuard, Daemon, DaemonBuilder, KEY_A, Role};
use common::drain;
use common::redis_server::RedisServer;
use common::up_keys::{ensure_keys, read_key};

const PLAYGROUND_KEY: &str = "key-play-0123456789";
/// The second daemon's admin key, for its dashboard.
const SHARED_ADMIN_KEY: &str = "key-ops-0123456789";
/// Longest the whole browser run may take.
const BROWSER_DEADLINE: Duration = Duration::from_secs(300);

fn screenshots() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target directory")
        .join("browser-screenshots")
}

/// Fails with what to install when a tool the browser tests need is missing.
fn require(paths: &[&str]) {
    for path in paths {
        assert!(
            Path::new(path).exists(),
            "{path} is missing: the browser tests need Debian's chromium, chromium-driver and \
             python3-selenium (scripts/lib/services.sh installs them with the test packages)"
        );
    }
}

/// The first daemon, its Redis, and the operator's key it was given: the
/// two keys `scripts/up` makes (`scripts/lib/keys.sh`), beside key `a`.
async fn daemons() -> (RedisServer, Daemon, RedisServer, Daemon, String) {
    let state = tempfile::tempdir().expect("a directory for the keys");
    let (_, up_keys) = ensure_keys(state.path());
    let admin_key = read_key(state.path(), "admin-key");
    let redis = RedisServer::start();
    // Heartbeats every 500 ms, so the dashboard sees a slot taken at once.
    let own_key = DaemonBuilder::new(Role::Serve, &redis)
        .env("CODE_RUNNER_API_KEYS", format!("a:{KEY_A},{up_keys}"))
        .env("CODE_RUNNER_HEARTBEAT_INTERVAL_MS", 500)
        .env("CODE_RUNNER_HEARTBEAT_TTL_MS", 2000)
        // A warm pool, so the pages show warm starts and warm figures.
        .env("CODE_RUNNER_WARM_MAX", 2)
        .env("CODE_RUNNER_WARM", "python=2")
        .start()
        .await;
    let shared_redis = RedisServer::start();
    let shared_key = DaemonBuilder::new(Role::Serve, &shared_redis)
        .env(
            "CODE_RUNNER_API_KEYS",
            format!("a:{KEY_A},play:{PLAYGROUND_KEY}:2,ops:{SHARED_ADMIN_KEY}:admin"),
        )
        .env("CODE_RUNNER_PLAYGROUND_PATH", "/playground")
        .env("CODE_RUNNER_PLAYGROUND_KEY", "play")
        // A warm pool whose memory reserve (a petabyte) the machine does
        // not have: it starts nothing, and its dashboard says why.
        .env("CODE_RUNNER_WARM_MAX", 1)
        .env("CODE_RUNNER_WARM", "python=1")
        .env("CODE_RUNNER_WARM_MEMORY_RESERVE_MB", 1u64 << 30)
        .env("CODE_RUNNER_HEARTBEAT_INTERVAL_MS", 500)
        .env("CODE_RUNNER_HEARTBEAT_TTL_MS", 2000)
        .start()
        .await;
    own_key
        .wait_metric(
            "code_runner_warm_ready{language=\"python\"}",
            2.0,
            Duration::from_secs(60),
        )
        .await;
    (redis, own_key, shared_redis, shared_key, admin_key)
}

/// Runs `pages.py` in `browser` against both daemons; fails with its output
/// unless every test passed.
fn run_pages(browser: &str, own_key: &Daemon, shared_key: &Daemon, admin_key: &str) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/daemon/browser/pages.py");
    let mut child = Command::new("/usr/bin/python3")
        .arg(&script)
        .env("CODE_RUNNER_URL", &own_key.url)
        .env("CODE_RUNNER_SHARED_URL", &shared_key.url)
        .env("CODE_RUNNER_KEY", KEY_A)
        .env("CODE_RUNNER_ADMIN_KEY", admin_key)
        .env("CODE_RUNNER_PLAYGROUND_KEY", PLAYGROUND_KEY)
        .env("CODE_RUNNER_SHARED_ADMIN_KEY", SHARED_ADMIN_KEY)
        .env("CODE_RUNNER_SCREENSHOTS", screenshots())
        .env("CODE_RUNNER_BROWSER", browser)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("/usr/bin/python3 starts");
    let (stdout, stderr) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let mut child = ChildGuard(child);
    let deadline = Instant::now() + BROWSER_DEADLINE;
    let status = loop {
        if let Some(status) = child.0.try_wait().expect("waiting for python3") {
            break Some(status);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    drop(child); // kills it if it still runs
    let output = format!(
        "{}{}",
        String::from_utf8_lossy(&stdout.join().unwrap()),
        String::from_utf8_lossy(&stderr.join().unwrap())
    );
    println!("{output}");
    let status = status
        .unwrap_or_else(|| panic!("the {browser} tests ran over {BROWSER_DEADLINE:?}:\n{output}"));
    assert!(status.success(), "the {browser} tests failed:\n{output}");
    assert!(output.contains("Ran 18 tests"), "{output}");
    println!(
        "screenshots of every state: {}/{browser}-*.png",
        screenshots().display()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn playground_and_dashboard_in_chromium() {
    require(&[
        "/usr/bin/chromium",
        "/usr/bin/chromedriver",
        "/usr/bin/python3",
    ]);
    let (_redis, own_key, _shared_redis, shared_key, admin_key) = daemons().await;
    tokio::task::block_in_place(|| run_pages("chromium", &own_key, &shared_key, &admin_key));
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "opt-in: needs Firefox ESR (scripts/install-firefox); CODE_RUNNER_TEST_FIREFOX=1 scripts/test runs it"]
async fn playground_and_dashboard_in_firefox() {
    require(&["/usr/bin/firefox-esr", "/usr/bin/python3"]);
    let (_redis, own_key, _shared_redis, shared_key, admin_key) = daemons().await;
    tokio::task::block_in_place(|| run_pages("firefox", &own_key, &shared_key, &admin_key));
}
