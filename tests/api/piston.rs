//! The Piston v2 API (`/api/v2/…`) against a whole `code-runner serve` in
//! the test on the scripted engine, driven by the unmodified npm package
//! `piston-client` (runtimes, execute) and, for the interactive
//! `/api/v2/connect`, by Python's `websockets`: the runtimes on offer,
//! Piston's shapes of a compile error, a timeout, an output limit and an
//! exit code, its error messages, a key at its limit, and the connect
//! protocol. The clients are installed by `scripts/compat-clients`. (Real
//! languages through piston-client are in the `daemon` binary's `piston`.)

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::client::{KEY_A, POLL, metric};
use crate::common::compat::{piston_client, piston_settings};
use crate::common::daemon::Role;
use crate::common::in_process::{InProcess, InProcessBuilder};
use crate::common::redis_server::RedisServer;
use crate::common::scripted::ScriptedHost;

// The clients run as child processes the test waits for, blocking its
// thread: the tests run on a multi-thread runtime, so that the server in
// the test answers meanwhile.

struct Piston {
    daemon: InProcess,
    redis: RedisServer,
    _dir: tempfile::TempDir,
}

impl Piston {
    /// `serve` with keyless loopback Piston requests served as key `a`
    /// (`a` may have at most `max_active` jobs at once).
    async fn start(max_active: Option<u32>) -> Self {
        let redis = RedisServer::start();
        let dir = tempfile::tempdir().unwrap();
        // No image of the catalog is missing on the host but COBOL's.
        let host = ScriptedHost::new();
        host.set_missing_images(&["code-runner/does-not-exist:latest"]);
        let mut builder = InProcessBuilder::new(Role::Serve, &redis).host(&host);
        for (name, value) in piston_settings(dir.path(), max_active) {
            builder = builder.env(name, value);
        }
        let daemon = builder.start().await;
        Self {
            daemon,
            redis,
            _dir: dir,
        }
    }

    fn execute(&self, language: &str, code: &str, config: Value) -> Value {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), code).unwrap();
        piston_client(
            &self.daemon.url,
            &[
                "execute",
                language,
                file.path().to_str().unwrap(),
                &config.to_string(),
            ],
        )
    }

    async fn post(&self, path: &str, body: &Value, key: Option<&str>) -> (StatusCode, Value) {
        let mut request = self
            .daemon
            .http
            .post(format!("{}/api/v2{path}", self.daemon.url))
            .body(body.to_string());
        if let Some(key) = key {
            request = request.header("authorization", key);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtimes_list_the_installed_languages_by_pistons_names() {
    let piston = Piston::start(None).await;
    let runtimes = piston_client(&piston.daemon.url, &["runtimes"]);
    let runtimes = runtimes.as_array().expect("an array of runtimes");
    let find = |name: &str| {
        runtimes
            .iter()
            .find(|r| r["language"] == name)
            .unwrap_or_else(|| panic!("{name} in {runtimes:#?}"))
    };
    assert_eq!(
        find("python"),
        &json!({"language": "python", "version": "3.11.0", "aliases": ["py", "python3"]})
    );
    let cpp = find("c++");
    assert_eq!(cpp["version"], "12.0.0");
    assert_eq!(cpp["runtime"], "gcc");
    assert!(cpp["aliases"].as_array().unwrap().contains(&json!("cpp")));
    assert_eq!(find("javascript")["runtime"], "node");
    assert_eq!(find("rscript")["aliases"][0], "r");
    assert_eq!(find("sqlite3")["language"], "sqlite3");
    // COBOL is in the catalog but no worker has its image.
    assert!(
        runtimes.iter().all(|r| r["language"] != "cobol"),
        "{runtimes:#?}"
    );
    let ours = piston.daemon.get("/v1/languages", None).await;
    let ids: Vec<&str> = ours.body["languages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["id"].as_str().unwrap())
        .collect();
    assert!(
        ids.contains(&"python") && !ids.contains(&"cobol"),
        "{ids:?}"
    );
    assert_eq!(ids.len(), runtimes.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compile_errors_timeouts_and_output_limits_in_pistons_shape() {
    let piston = Piston::start(None).await;

    let answer = piston.execute(
        "c",
        "compile-error main.c:1:25: error: 'nope' undeclared (first use in this function)",
        json!({}),
    );
    assert_eq!(answer["language"], "c");
    assert_eq!(answer["version"], "12.0.0");
    let compile = &answer["compile"];
    assert_eq!(compile["code"], 1, "{answer:#}");
    assert_eq!(compile["status"], "RE");
    assert_eq!(compile["message"], "Exited with error status 1");
    assert!(
        compile["stderr"].as_str().unwrap().contains("nope"),
        "{answer:#}"
    );
    // Piston: when the run stage never started, `run` is the compile stage.
    assert_eq!(answer["run"], answer["compile"]);

    let answer = piston.execute("python", "sleep 60000", json!({"runTimeout": 500}));
    let run = &answer["run"];
    assert_eq!(run["status"], "TO", "{answer:#}");
    assert_eq!(run["signal"], "SIGKILL");
    assert_eq!(run["code"], Value::Null);
    assert_eq!(run["message"], "Time limit exceeded (wall clock)");
    assert!(run["wall_time"].as_u64().unwrap() >= 500, "{answer:#}");

    let answer = piston.execute(
        "python",
        // 3 MiB of `x`.
        &format!("repeat 768\nwrite {}\nend\nprint never", "x".repeat(4096)),
        json!({}),
    );
    let run = &answer["run"];
    assert_eq!(run["status"], "OL", "{}", run["message"]);
    assert_eq!(run["message"], "stdout length exceeded");
    assert_eq!(run["signal"], "SIGKILL");
    assert_eq!(run["stdout"].as_str().unwrap().len(), 1 << 20);
    assert!(run["stdout"].as_str().unwrap().bytes().all(|b| b == b'x'));

    let answer = piston.execute(
        "python",
        // The two lines 0.2 s apart: `output` holds them in the order they
        // arrived, and two pipes written microseconds apart may be read in
        // either order.
        "print to stdout\nsleep 200\neprint to stderr\nexit 3",
        json!({}),
    );
    let run = &answer["run"];
    assert_eq!(
        (run["code"].as_i64(), run["status"].as_str()),
        (Some(3), Some("RE"))
    );
    assert_eq!(run["stdout"], "to stdout\n");
    assert_eq!(run["stderr"], "to stderr\n");
    assert_eq!(run["output"], "to stdout\nto stderr\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_pistons_messages() {
    let piston = Piston::start(None).await;
    // piston-client sends no version for a language runtimes does not list.
    let answer = piston.execute("cobol", "DISPLAY 'x'.", json!({}));
    assert_eq!(
        answer,
        json!({"message": "version is required as a string"})
    );

    let job = |extra: Value| {
        let mut body =
            json!({"language": "python", "version": "*", "files": [{"content": "print 1"}]});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    let cases = [
        (json!({"language": "cobol"}), "cobol-* runtime is unknown"),
        (json!({"version": "2.7"}), "python-2.7 runtime is unknown"),
        (json!({"files": "x"}), "files is required as an array"),
        (
            json!({"files": [{"name": "a.py"}]}),
            "files[0].content is required as a string",
        ),
        (
            json!({"run_timeout": "soon"}),
            "If specified, run_timeout must be a number",
        ),
        (
            json!({"run_timeout": 999_999_999}),
            "run_timeout cannot exceed the configured limit of 300000",
        ),
        (
            json!({"compile_cpu_time": -5}),
            "compile_cpu_time must be non-negative",
        ),
        (
            json!({"files": [{"content": "eA==", "encoding": "base64"}]}),
            "files must include at least one utf8 encoded file",
        ),
        // A control character in a file's name, named with the file.
        (
            json!({"files": [{"content": "print 1"}, {"name": "a\tb.py", "content": ""}]}),
            "files[1].name: \"a\\tb.py\" contains the control character '\\t'; \
             file names must be printable",
        ),
    ];
    for (extra, message) in cases {
        let (status, body) = piston.post("/execute", &job(extra.clone()), None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{extra}: {body}");
        assert_eq!(body, json!({"message": message}), "{extra}");
    }
    // A key that is not configured is refused even from loopback.
    let (status, body) = piston
        .post("/execute", &job(json!({})), Some("not-a-key-0123456789"))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        body["message"].as_str().unwrap().contains("API key"),
        "{body}"
    );
    // The key itself works, raw or as a bearer token.
    let (status, body) = piston.post("/execute", &job(json!({})), Some(KEY_A)).await;
    assert_eq!(
        (status, &body["run"]["stdout"]),
        (StatusCode::OK, &json!("1\n")),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_over_its_limit_gets_429() {
    let piston = Piston::start(Some(1)).await;
    let url = format!("{}/api/v2/execute", piston.daemon.url);
    let http = piston.daemon.http.clone();
    // The first job holds key a's only slot until the test cancels it (its
    // sleep outlasts the test), so the window in which the next submissions
    // are refused cannot close early. Should the test fail before the
    // cancel, dropping the daemon stops it and removes the job's sandbox.
    let first = tokio::spawn(async move {
        let body = json!({
            "language": "bash",
            "version": "*",
            "run_timeout": 180_000,
            "files": [{"content": "print started\nsleep 170000"}],
        });
        let response = http.post(url).body(body.to_string()).send().await.unwrap();
        (response.status(), response.json::<Value>().await.unwrap())
    });
    piston
        .daemon
        .wait_metric("code_runner_slots_used", 1.0, Duration::from_secs(60))
        .await;
    // Its id: the one job in key a's active set.
    let first_id = piston.redis.cli(&["SMEMBERS", "apikey:a:active"]);
    assert!(
        uuid::Uuid::parse_str(&first_id).is_ok(),
        "not one job id: {first_id:?}"
    );
    // Its program runs (so cancelling it kills the run stage).
    let events = format!("job:{first_id}:events");
    let within = Duration::from_secs(60);
    let deadline = Instant::now() + within;
    loop {
        let stream = piston.redis.cli(&["XRANGE", &events, "-", "+"]);
        if stream.contains("started") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the first job printed nothing within {within:?}: {stream}"
        );
        tokio::time::sleep(POLL).await;
    }

    let body = json!({"language": "bash", "version": "*", "files": [{"content": "print second"}]});
    let response = piston
        .daemon
        .http
        .post(format!("{}/api/v2/execute", piston.daemon.url))
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()["retry-after"], "1");
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        body,
        json!({"message": "this api key already has 1 queued or running jobs, its limit of 1 (the key entry's max_active)"})
    );
    // piston-client hands the same answer to its caller.
    let answer = piston.execute("bash", "print third", json!({}));
    assert_eq!(answer, body);

    // Cancelled, the first job is killed and its caller told so.
    let cancelled = piston.daemon.cancel(&first_id).await;
    assert_eq!(cancelled.status, StatusCode::ACCEPTED, "{cancelled:#?}");
    let (status, first) = first.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{first:#}");
    assert_eq!(first["run"]["stdout"], "started\n", "{first:#}");
    assert_eq!(first["run"]["signal"], "SIGKILL", "{first:#}");
    assert_eq!(first["run"]["code"], Value::Null, "{first:#}");
    let view = piston
        .daemon
        .wait_terminal(&first_id, Duration::from_secs(30))
        .await;
    assert_eq!(view["status"], "cancelled", "{view:#}");
    piston.daemon.assert_no_sandboxes().await;

    let metrics = piston.daemon.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "code_runner_submissions_rejected_total{reason=\"key_limit\"}"
        ),
        Some(2.0),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_runs_an_interactive_program_over_the_websocket() {
    let piston = Piston::start(None).await;
    let url = piston.daemon.url.replace("http://", "ws://") + "/api/v2/connect";
    let script = r#"
import asyncio, json, sys
import websockets

async def main(url):
    async with websockets.connect(url) as ws:
        await ws.send(json.dumps({"type": "init", "language": "python", "version": "*",
            "files": [{"content": "readline hello\\x20\nreadline"}]}))
        seen = []
        sent = 0
        stdout = ""
        try:
            while True:
                message = json.loads(await asyncio.wait_for(ws.recv(), 30))
                seen.append(message)
                if message["type"] == "stage" and message["stage"] == "run":
                    await ws.send(json.dumps({"type": "data", "stream": "stdin", "data": "ada\n"}))
                    sent += 1
                if message["type"] == "data" and message["stream"] == "stdout":
                    stdout += message["data"]
                # Once, to the whole greeting (which may come as several
                # messages): the program's last line ("hello") comes right
                # before its exit and the close, and a send after the close
                # raises before the exit is read.
                if stdout == "hello ada\n" and sent == 1:
                    await ws.send(json.dumps({"type": "data", "stream": "stdin", "data": "hello\n"}))
                    sent += 1
        except websockets.exceptions.ConnectionClosed as closed:
            print(json.dumps({"seen": seen, "code": closed.code, "reason": closed.reason}))

asyncio.run(main(sys.argv[1]))
"#;
    let output = std::process::Command::new("/usr/bin/python3")
        .args(["-c", script, &url])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stdout)));
    assert_eq!(report["code"], 4999, "{report:#}");
    assert_eq!(report["reason"], "Job Completed");
    let seen = report["seen"].as_array().unwrap();
    assert_eq!(
        seen[0],
        json!({"type": "runtime", "language": "python", "version": "3.11.0"})
    );
    assert_eq!(seen[1], json!({"type": "stage", "stage": "run"}));
    // Only Piston's own messages: the program waited for input twice, and
    // code-runner's `input_wanted` is not one of them.
    for message in seen {
        let kind = message["type"].as_str().unwrap();
        assert!(
            ["runtime", "stage", "data", "exit"].contains(&kind),
            "{message}"
        );
    }
    let stdout: String = seen
        .iter()
        .filter(|m| m["type"] == "data" && m["stream"] == "stdout")
        .map(|m| m["data"].as_str().unwrap())
        .collect();
    assert_eq!(stdout, "hello ada\nhello\n", "{report:#}");
    assert_eq!(
        seen.last().unwrap(),
        &json!({"type": "exit", "stage": "run", "code": 0, "signal": null}),
        "{report:#}"
    );

    // Protocol errors close with Piston's codes.
    let script = r#"
import asyncio, json, sys
import websockets

async def closed_with(url, messages):
    async with websockets.connect(url) as ws:
        for m in messages:
            await ws.send(m)
        try:
            while True:
                await asyncio.wait_for(ws.recv(), 10)
        except websockets.exceptions.ConnectionClosed as closed:
            return [closed.code, closed.reason]

async def main(url):
    print(json.dumps([
        await closed_with(url, []),
        await closed_with(url, [json.dumps({"type": "data", "stream": "stdin", "data": "x"})]),
        await closed_with(url, [json.dumps({"type": "init", "language": "cobol", "version": "*", "files": []})]),
    ]))

asyncio.run(main(sys.argv[1]))
"#;
    let output = std::process::Command::new("/usr/bin/python3")
        .args(["-c", script, &url])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let closes: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        closes,
        json!([
            [4001, "Initialization Timeout"],
            [4003, "Not yet initialized"],
            [4002, "Notified Error"]
        ])
    );
    tokio::time::sleep(Duration::from_millis(10)).await;
}
