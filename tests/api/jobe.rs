//! Jobe's REST API (`/jobe/index.php/restapi/…`, what Moodle's CodeRunner
//! calls) against a whole `code-runner serve` in the test on the scripted
//! engine: the languages, every outcome code of `POST runs`, Jobe's
//! refusals word for word, its keys, the `file_list` 404 → `PUT files` →
//! retry flow CodeRunner uses, a run refused for load answered as
//! "overload", and cross-origin preflights. (Real languages through the
//! same routes are in the `daemon` binary's `jobe`.)

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::common::client::{KEY_A, KEY_B};
use crate::common::daemon::Role;
use crate::common::in_process::{InProcess, InProcessBuilder};
use crate::common::redis_server::RedisServer;

const JOBE: &str = "/jobe/index.php/restapi";

/// `serve` with the Jobe API; `settings` added (or overriding).
async fn serve(redis: &RedisServer, settings: &[(&str, &str)]) -> InProcess {
    let mut builder = InProcessBuilder::new(Role::Serve, redis)
        .env("CODE_RUNNER_API_KEYS", format!("a:{KEY_A},b:{KEY_B}"));
    for (name, value) in settings {
        builder = builder.env(name, value);
    }
    builder.start().await
}

/// A request to the Jobe API with `key` as `X-API-KEY`: its status and
/// its body as JSON (`Null` when empty or not JSON).
async fn call(
    daemon: &InProcess,
    method: Method,
    path: &str,
    body: Option<Value>,
    key: Option<&str>,
) -> (StatusCode, Value) {
    let mut request = daemon
        .http
        .request(method, format!("{}{JOBE}{path}", daemon.url));
    if let Some(key) = key {
        request = request.header("X-API-KEY", key);
    }
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json; charset=utf-8")
            .body(body.to_string());
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn run(daemon: &InProcess, spec: Value) -> (StatusCode, Value) {
    call(
        daemon,
        Method::POST,
        "/runs/",
        Some(json!({ "run_spec": spec })),
        Some(KEY_A),
    )
    .await
}

/// A python3 run of the scripted engine's `script`.
async fn run_script(daemon: &InProcess, script: &str) -> Value {
    let (status, answer) = run(
        daemon,
        json!({"language_id": "python3", "sourcecode": script, "sourcefilename": "__tester__.python3"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn languages_are_listed_by_jobes_ids_with_our_versions() {
    let redis = RedisServer::start();
    let daemon = serve(&redis, &[]).await;
    let (status, languages) = call(&daemon, Method::GET, "/languages", None, None).await;
    assert_eq!(status, StatusCode::OK);
    let ours = daemon.get("/v1/languages", None).await.body;
    let version = |id: &str| {
        ours["languages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["id"] == id)
            .map(|l| l["version"].clone())
            .unwrap()
    };
    assert_eq!(
        languages,
        json!([
            ["c", version("c")],
            ["cpp", version("cpp")],
            ["python3", version("python")],
            ["java", version("java")],
            ["nodejs", version("javascript")],
            ["php", version("php")],
            ["pascal", version("pascal")],
        ])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_ending_has_jobes_outcome_code() {
    let redis = RedisServer::start();
    let daemon = serve(&redis, &[]).await;

    let hello = run_script(&daemon, "print Hello world!").await;
    let id = hello["run_id"].as_str().unwrap().to_string();
    assert_eq!(
        hello,
        json!({"run_id": id, "outcome": 15, "cmpinfo": "", "stdout": "Hello world!\n", "stderr": ""})
    );
    // The run is an ordinary job of the key.
    let job = daemon
        .get(&format!("/v1/jobs/{id}"), Some(KEY_A))
        .await
        .body;
    assert_eq!(job["status"], "succeeded");
    assert_eq!(job["metadata"]["via"], "jobe", "{job}");

    let cases: [(&str, u8, &str, &str); 8] = [
        // Jobe's rule: anything on stderr is a runtime error, a quiet
        // non-zero exit is not.
        ("print out\neprint oops", 12, "out\n", "oops\n"),
        ("exit 3", 15, "", ""),
        ("die SIGSEGV", 12, "", ""),
        ("ewrite late\ncpu-limit", 13, "", ""),
        ("flood 3000000", 13, "", ""),
        ("oom", 17, "", ""),
        ("die SIGSYS", 19, "", ""),
        (
            "write Hello\\n\\x01\\x06\\xc0\\xc9\\n",
            15,
            "Hello\n\\x01\\x06\\xc0\\xc9\n",
            "",
        ),
    ];
    for (script, outcome, stdout, stderr) in cases {
        let answer = run_script(&daemon, script).await;
        assert_eq!(answer["outcome"], outcome, "{script}: {answer}");
        assert_eq!(answer["cmpinfo"], "", "{script}");
        assert_eq!(answer["stderr"], stderr, "{script}");
        if script != "flood 3000000" {
            assert_eq!(answer["stdout"], stdout, "{script}");
        } else {
            // Cut at the server's output limit (1 MiB by default).
            let stdout = answer["stdout"].as_str().unwrap();
            assert!(stdout.len() <= 1 << 20 && stdout.starts_with("yyyy"));
        }
    }

    // A Python source that does not parse is Jobe's compile error.
    let syntax = run_script(
        &daemon,
        "ewrite   File \"__tester__.python3\", line 1\\n    print(\\nSyntaxError: '(' was never closed\\n\nexit 1",
    )
    .await;
    assert_eq!(syntax["outcome"], 11);
    assert_eq!(
        syntax["cmpinfo"],
        "  File \"__tester__.python3\", line 1\n    print(\nSyntaxError: '(' was never closed\n"
    );
    let (_, compile) = run(
        &daemon,
        json!({"language_id": "c", "sourcecode": "compile-error prog.c:2: error: expected ';'"}),
    )
    .await;
    assert_eq!(
        compile,
        json!({"run_id": compile["run_id"], "outcome": 11,
            "cmpinfo": "prog.c:2: error: expected ';'\n", "stdout": "", "stderr": ""})
    );
    // A sandbox that dies is Jobe's internal error.
    let crashed = run_script(&daemon, "crash").await;
    assert_eq!(crashed["outcome"], 20, "{crashed}");
    assert!(!crashed["stderr"].as_str().unwrap().is_empty());
    // Jobe's own test of its overload answer.
    let overload = run_script(&daemon, "!** TESTING OVERLOAD EXCEPTION **!").await;
    assert_eq!(
        overload,
        json!({"run_id": null, "outcome": 21, "cmpinfo": "", "stdout": "", "stderr": ""})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_jobes_words_as_json_strings() {
    let redis = RedisServer::start();
    let daemon = serve(&redis, &[]).await;
    let python = |extra: Value| {
        let mut spec = json!({"language_id": "python3", "sourcecode": "print x"});
        spec.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        spec
    };
    let cases = [
        (
            json!({"sourcecode": "print x"}),
            "run_spec is missing the required attribute 'language_id'",
        ),
        (
            json!({"language_id": "python3"}),
            "run_spec is missing the required attribute 'sourcecode'",
        ),
        (
            json!({"language_id": "nosuchlanguage", "sourcecode": ""}),
            "Language 'nosuchlanguage' is not known",
        ),
        (
            python(json!({"parameters": {"cputime": 1000}})),
            "cputime exceeds maximum allowed on this Jobe server (120 secs)",
        ),
        (
            python(json!({"sourcefilename": "../escape.py"})),
            "The sourcefilename for the run_spec is illegal",
        ),
        (
            python(json!({"file_list": [["abc", "data.txt"]]})),
            "Invalid file specifier: Array\n(\n    [0] => abc\n    [1] => data.txt\n)\n",
        ),
    ];
    for (spec, message) in cases {
        let (status, answer) = run(&daemon, spec.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{spec}");
        assert_eq!(answer, json!(message), "{spec}");
    }
    let (status, answer) = call(
        &daemon,
        Method::POST,
        "/runs",
        Some(json!({"spec": {}})),
        Some(KEY_A),
    )
    .await;
    assert_eq!(
        (status, answer),
        (
            StatusCode::BAD_REQUEST,
            json!("No run_spec attribute found in post data")
        )
    );
    // Our own checks of the job, in the same shape.
    let (status, answer) = run(
        &daemon,
        python(json!({"parameters": {"runargs": ["a\u{0}b"]}})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        answer,
        json!("args[0]: must be at most 4096 bytes with no NUL")
    );
    // Without CODE_RUNNER_JOBE_KEY the Jobe API needs a code-runner key.
    let spec = Some(json!({"run_spec": python(json!({}))}));
    let response = |key: Option<&'static str>| {
        let mut request = daemon.http.post(format!("{}{JOBE}/runs", daemon.url));
        if let Some(key) = key {
            request = request.header("X-API-KEY", key);
        }
        let body = spec.clone().unwrap().to_string();
        async move {
            let response = request.body(body).send().await.unwrap();
            (response.status(), response.text().await.unwrap())
        }
    };
    assert_eq!(
        response(None).await,
        (StatusCode::FORBIDDEN, "Missing API key".to_string())
    );
    assert_eq!(
        response(Some("2AAA7A5415B4A9B394B54BF1D2E9D")).await,
        (StatusCode::FORBIDDEN, "Unknown API key".to_string())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_jobe_key_serves_requests_without_a_code_runner_key() {
    let redis = RedisServer::start();
    let daemon = serve(&redis, &[("CODE_RUNNER_JOBE_KEY", "b")]).await;
    let spec = json!({"run_spec": {"language_id": "python3", "sourcecode": "print hi"}});
    for key in [None, Some("2AAA7A5415B4A9B394B54BF1D2E9D")] {
        let (status, answer) = call(&daemon, Method::POST, "/runs", Some(spec.clone()), key).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(answer["stdout"], "hi\n");
        // Served as key b: its job, not a's.
        let id = answer["run_id"].as_str().unwrap();
        let job = daemon
            .get(&format!("/v1/jobs/{id}"), Some(KEY_B))
            .await
            .body;
        assert_eq!(job["status"], "succeeded", "{job}");
    }
    // A code-runner key still counts as itself.
    let (_, answer) = call(&daemon, Method::POST, "/runs", Some(spec), Some(KEY_A)).await;
    let id = answer["run_id"].as_str().unwrap();
    assert_eq!(
        daemon
            .get(&format!("/v1/jobs/{id}"), Some(KEY_A))
            .await
            .body["status"],
        "succeeded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn support_files_go_missing_then_put_then_run() {
    let redis = RedisServer::start();
    let daemon = serve(&redis, &[]).await;
    let id = "0f343b0931126a20f133d67c2b018a3b"; // as CodeRunner: an MD5
    let spec = json!({
        "language_id": "python3",
        "sourcecode": "cat data/../file1\ncat file1",
        "sourcefilename": "__tester__.python3",
        "file_list": [[id, "file1"]],
    });
    // CodeRunner's flow: run, 404, PUT the file, run again.
    let (status, answer) = run(&daemon, spec.clone()).await;
    assert_eq!(
        (status, answer),
        (
            StatusCode::NOT_FOUND,
            json!("One or more of the specified files is missing/unavailable")
        )
    );
    let path = format!("/files/{id}");
    let (status, _) = call(&daemon, Method::HEAD, &path, None, Some(KEY_A)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let contents = b"The first file\nLine 2\xff";
    let put = json!({"file_contents": STANDARD.encode(contents)});
    let (status, body) = call(&daemon, Method::PUT, &path, Some(put.clone()), Some(KEY_A)).await;
    assert_eq!((status, body), (StatusCode::NO_CONTENT, Value::Null));
    let (status, _) = call(&daemon, Method::HEAD, &path, None, Some(KEY_A)).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    // Another key has no such file.
    let (status, _) = call(&daemon, Method::HEAD, &path, None, Some(KEY_B)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, answer) = run(&daemon, spec).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["outcome"], 12, "{answer}");
    assert_eq!(answer["stdout"], "The first file\nLine 2\\xff");
    assert_eq!(
        answer["stderr"],
        "cat: data/../file1: No such file or directory\n"
    );
    // The bytes are the file store's, by their SHA-256.
    let digest = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(contents))
    };
    let stored = daemon
        .http
        .get(format!("{}/v1/files/{digest}", daemon.url))
        .bearer_auth(KEY_A)
        .send()
        .await
        .unwrap();
    assert_eq!(stored.status(), StatusCode::OK);
    assert_eq!(stored.bytes().await.unwrap().as_ref(), contents);

    // Jobe's refusals of a put.
    let cases = [
        (
            json!({"contents": "eA=="}),
            "put: missing file_contents parameter",
        ),
        (
            json!({"file_contents": "not base64!"}),
            &*format!("put: contents of file {id} are not valid base-64"),
        ),
    ];
    for (body, message) in cases {
        let (status, answer) = call(&daemon, Method::PUT, &path, Some(body), Some(KEY_A)).await;
        assert_eq!((status, answer), (StatusCode::BAD_REQUEST, json!(message)));
    }
    let (status, _) = call(
        &daemon,
        Method::PUT,
        "/files/not-an-id",
        Some(put),
        Some(KEY_A),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_refused_for_load_is_jobes_overload() {
    let redis = RedisServer::start();
    let daemon = serve(
        &redis,
        &[("CODE_RUNNER_API_KEYS", &format!("a:{KEY_A}:1,b:{KEY_B}"))],
    )
    .await;
    // Key a may have one job at a time: the second run, while the first
    // sleeps, is refused for the key's limit.
    let first = {
        let daemon_url = daemon.url.clone();
        let http = daemon.http.clone();
        tokio::spawn(async move {
            http.post(format!("{daemon_url}{JOBE}/runs"))
                .header("X-API-KEY", KEY_A)
                .body(json!({"run_spec": {"language_id": "python3", "sourcecode": "sleep 3000\nprint done"}}).to_string())
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    let second = run_script(&daemon, "print second").await;
    assert_eq!(second["outcome"], 21, "{second}");
    assert_eq!(second["run_id"], Value::Null);
    assert!(
        second["stderr"].as_str().unwrap().contains("key a"),
        "{second}"
    );
    let first = first.await.unwrap();
    assert_eq!(
        (first["outcome"].clone(), first["stdout"].clone()),
        (json!(15), json!("done\n"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_page_of_another_origin_may_call_it() {
    let redis = RedisServer::start();
    let daemon = serve(&redis, &[]).await;
    let preflight = daemon
        .http
        .request(Method::OPTIONS, format!("{}{JOBE}/runs", daemon.url))
        .header("origin", "https://moodle.example.edu")
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "x-api-key, content-type")
        .send()
        .await
        .unwrap();
    assert_eq!(preflight.status(), StatusCode::OK);
    let headers = preflight.headers();
    assert_eq!(headers["access-control-allow-origin"], "*");
    let methods = headers["access-control-allow-methods"].to_str().unwrap();
    assert!(methods == "*" || methods.contains("POST"), "{methods}");
    let languages = daemon
        .http
        .get(format!("{}{JOBE}/languages", daemon.url))
        .header("origin", "https://moodle.example.edu")
        .send()
        .await
        .unwrap();
    assert_eq!(languages.headers()["access-control-allow-origin"], "*");

    // An operator's list of origins narrows it.
    let redis = RedisServer::start();
    let narrowed = serve(
        &redis,
        &[(
            "CODE_RUNNER_JOBE_CORS_ORIGINS",
            "https://moodle.example.edu",
        )],
    )
    .await;
    let other = narrowed
        .http
        .get(format!("{}{JOBE}/languages", narrowed.url))
        .header("origin", "https://elsewhere.example.org")
        .send()
        .await
        .unwrap();
    assert!(other.headers().get("access-control-allow-origin").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_over_its_rate_gets_jobes_429() {
    let redis = RedisServer::start();
    let daemon = serve(
        &redis,
        &[
            ("CODE_RUNNER_KEY_RATE", "1"),
            ("CODE_RUNNER_KEY_BURST", "1"),
        ],
    )
    .await;
    let spec = json!({"run_spec": {"language_id": "python3", "sourcecode": "print hi"}});
    let (status, _) = call(
        &daemon,
        Method::POST,
        "/runs",
        Some(spec.clone()),
        Some(KEY_A),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let response = daemon
        .http
        .post(format!("{}{JOBE}/runs", daemon.url))
        .header("X-API-KEY", KEY_A)
        .body(spec.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(response.headers().contains_key("retry-after"));
    assert_eq!(
        response.text().await.unwrap(),
        "Max RUN rate for this server exceeded"
    );
}
