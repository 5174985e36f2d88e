//! Judge0's routes for operators and dashboards, against a whole
//! `code-runner serve` (or `api` and `worker`) in the test on the scripted
//! engine: `DELETE /submissions/{token}`, `/workers`, `/statistics`,
//! `/system_info` and `/languages/all`.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::common;
use crate::common::client::{KEY_A, KEY_B, job};
use crate::common::daemon::Role;
use crate::common::in_process::InProcessBuilder;
use crate::common::redis_server::RedisServer;
use crate::common::scripted::{self, ScriptedHost};
use crate::compat_edges::{ADMIN_KEY, Auth, DONE, call, get_json, send, serve};

#[tokio::test]
async fn judge0_delete_needs_authorization_and_an_ended_submission_and_answers_with_it() {
    let redis = RedisServer::start();
    let daemon = serve(&redis, 1).await;
    let submit = |source: &'static str, wait: bool| {
        let daemon = &daemon;
        async move {
            let response = daemon
                .http
                .post(format!("{}/judge0/submissions?wait={wait}", daemon.url))
                .header("X-Auth-Token", KEY_A)
                .json(&json!({"source_code": source, "language_id": 46}))
                .send()
                .await
                .unwrap();
            let body: Value = response.json().await.unwrap();
            body["token"].as_str().expect("a token").to_string()
        }
    };
    let delete =
        |token: String, headers: Vec<(&'static str, &'static str)>, query: &'static str| {
            let daemon = &daemon;
            async move {
                let mut request = daemon
                    .http
                    .delete(format!("{}/judge0/submissions/{token}{query}", daemon.url));
                for (name, value) in headers {
                    request = request.header(name, value);
                }
                let response = request.send().await.unwrap();
                (response.status(), response.text().await.unwrap())
            }
        };
    let done = submit("print deleted", true).await;
    let authorized = vec![("X-Auth-Token", KEY_A), ("X-Auth-User", ADMIN_KEY)];
    // Authorization first: 403 with no body, nothing deleted.
    assert_eq!(
        delete(done.clone(), vec![("X-Auth-Token", KEY_A)], "").await,
        (StatusCode::FORBIDDEN, String::new())
    );
    assert_eq!(
        delete(
            done.clone(),
            vec![("X-Auth-Token", KEY_A), ("X-Auth-User", KEY_B)],
            ""
        )
        .await,
        (StatusCode::FORBIDDEN, String::new())
    );
    assert_eq!(
        delete(done.clone(), vec![("X-Auth-User", ADMIN_KEY)], "").await,
        (StatusCode::UNAUTHORIZED, String::new())
    );
    // Another key's submission is not found.
    let (status, body) = delete(
        done.clone(),
        vec![("X-Auth-Token", KEY_B), ("X-Auth-User", ADMIN_KEY)],
        "",
    )
    .await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::NOT_FOUND, r#"{"error":"submission not found"}"#)
    );
    // Deleted: answered with its fields, base64 whatever was asked.
    let (status, body) = delete(
        done.clone(),
        authorized.clone(),
        "?fields=token,stdout,status&base64_encoded=false",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({"token": done, "stdout": "ZGVsZXRlZAo=\n", "status": {"id": 3, "description": "Accepted"}})
    );
    // Gone everywhere: Judge0, /v1, the run history.
    let (status, _) = get_json(
        &daemon,
        &format!("/judge0/submissions/{done}"),
        Auth::Judge0,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        daemon
            .get(&format!("/v1/jobs/{done}"), Some(KEY_A))
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    let history = daemon.get("/v1/jobs", Some(KEY_A)).await;
    assert!(
        !history.body.to_string().contains(&done),
        "{:#}",
        history.body
    );
    assert_eq!(
        delete(done.clone(), authorized.clone(), "").await,
        (
            StatusCode::NOT_FOUND,
            r#"{"error":"submission not found"}"#.to_string()
        )
    );
    // The default fields are Judge0's.
    let other = submit("print two", true).await;
    let (status, body) = delete(other.clone(), authorized.clone(), "").await;
    assert_eq!(status, StatusCode::OK);
    let fields: Vec<String> = serde_json::from_str::<Value>(&body)
        .unwrap()
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert_eq!(
        fields,
        [
            "compile_output",
            "memory",
            "message",
            "status",
            "stderr",
            "stdout",
            "time",
            "token"
        ]
    );
    // Running, then queued behind it (one slot): 400, kept.
    let running = submit("sleep 30000", false).await;
    daemon.wait_status(&running, &["running"], DONE).await;
    let queued = submit("print later", false).await;
    assert_eq!(
        delete(running.clone(), authorized.clone(), "").await,
        (
            StatusCode::BAD_REQUEST,
            r#"{"error":"submission cannot be deleted because its status is 2 (Processing)"}"#
                .to_string()
        )
    );
    assert_eq!(
        delete(queued.clone(), authorized.clone(), "").await,
        (
            StatusCode::BAD_REQUEST,
            r#"{"error":"submission cannot be deleted because its status is 1 (In Queue)"}"#
                .to_string()
        )
    );
    assert_eq!(daemon.job(&running).await["status"], "running");
    daemon.cancel(&running).await;
    daemon.wait_terminal(&queued, DONE).await;
}

#[tokio::test]
async fn judge0_workers_statistics_system_info_and_languages_all_have_judge0s_shapes() {
    // The statistics count "today" and the 30 days before it (UTC).
    common::clear_of_utc_midnight(Duration::from_secs(120)).await;
    let redis = RedisServer::start();
    let daemon = serve(&redis, 1).await;
    let auth = Auth::Judge0;
    // One job of each outcome the statistics count, on key a.
    for (language, file, source, status) in [
        ("python", "main.py", "print ok", "succeeded"),
        ("bash", "main.sh", "exit 3", "failed"),
        (
            "c",
            "main.c",
            "compile-error main.c:1:11: error: expected declaration specifiers before '{' token",
            "failed",
        ),
    ] {
        let answer = daemon.submit_wait(&job(language, file, source)).await;
        assert_eq!(answer.body["status"], status, "{:#}", answer.body);
    }
    let (status, stats) = get_json(&daemon, "/judge0/statistics?invalidate_cache=true", auth).await;
    assert_eq!(status, StatusCode::OK, "{stats:#}");
    assert_eq!(stats["submissions"]["total"], 3, "{stats:#}");
    assert_eq!(stats["submissions"]["today"], 3);
    let days = stats["submissions"]["last_30_days"].as_object().unwrap();
    // The 30 days before today (today is `today`), by date.
    let today = code_runner::store::usage::Day::from_ms(code_runner::store::now_ms());
    let expected: std::collections::BTreeSet<String> =
        (1..=30).map(|back| today.plus(-back).to_string()).collect();
    let got: std::collections::BTreeSet<String> = days.keys().cloned().collect();
    assert_eq!(got, expected);
    assert!(days.values().all(|n| n == 0), "{days:?}");
    let languages: Vec<Value> = stats["languages"].as_array().unwrap().clone();
    assert_eq!(languages.len(), 3, "{languages:?}");
    for (id, name) in [
        (71, "Python (3.11)"),
        (46, "Bash (5.2)"),
        (50, "C (GCC 12)"),
    ] {
        assert!(
            languages.contains(&json!({"language": {"id": id, "name": name}, "count": 1})),
            "{id} {name}: {languages:?}"
        );
    }
    let statuses: Vec<Value> = stats["statuses"].as_array().unwrap().clone();
    assert_eq!(statuses.len(), 3, "{statuses:?}");
    for (id, name) in [
        (3, "Accepted"),
        (11, "Runtime Error (NZEC)"),
        (6, "Compilation Error"),
    ] {
        assert!(
            statuses.contains(&json!({"status": {"id": id, "name": name}, "count": 1})),
            "{id} {name}: {statuses:?}"
        );
    }
    assert!(
        stats["database"]["size_in_bytes"].as_u64().unwrap() > 0,
        "{stats:#}"
    );
    assert!(
        stats["database"]["size_pretty"]
            .as_str()
            .unwrap()
            .ends_with("kB"),
        "{stats:#}"
    );
    assert_eq!(stats["created_at"], stats["cached_until"]);
    // Key b has none of them.
    let (_, theirs) = {
        let call = call(
            Method::GET,
            "/judge0/statistics",
            Auth::Bearer(KEY_B),
            None,
            true,
        );
        let (s, _, t) = send(&daemon, &call, &call.path).await;
        (s, serde_json::from_str::<Value>(&t).unwrap())
    };
    assert_eq!(theirs["submissions"]["total"], 0);
    assert_eq!(theirs["languages"], json!([]));

    // /workers: the one slot busy with a python job, two more queued.
    let running = daemon.submit(&scripted::json("sleep 30000")).await.id();
    daemon.wait_status(&running, &["running"], DONE).await;
    let mut queued = Vec::new();
    for _ in 0..2 {
        queued.push(daemon.submit(&scripted::json("print 1")).await.id());
    }
    // The next heartbeat says the slot is taken.
    let python_busy =
        json!({"queue": "python", "size": 2, "available": 1, "idle": 0, "working": 1, "paused": 0});
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let workers = loop {
        let (status, workers) = get_json(&daemon, "/judge0/workers", auth).await;
        assert_eq!(status, StatusCode::OK);
        let python = workers
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["queue"] == "python")
            .cloned();
        if python.as_ref() == Some(&python_busy) {
            break workers;
        }
        assert!(std::time::Instant::now() < deadline, "{workers:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let bash = workers
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["queue"] == "bash")
        .cloned();
    assert_eq!(
        bash,
        Some(
            json!({"queue": "bash", "size": 0, "available": 1, "idle": 0, "working": 0, "paused": 0})
        )
    );
    daemon.cancel(&running).await;
    for id in &queued {
        daemon.wait_terminal(id, DONE).await;
    }

    // /system_info: lscpu's labels and free's totals of this machine.
    let (status, info) = get_json(&daemon, "/judge0/system_info", auth).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(info["Architecture"], std::env::consts::ARCH);
    let cpus: usize = info["CPU(s)"].as_str().unwrap().parse().unwrap();
    assert!(cpus >= 1, "{info:#}");
    assert!(
        info["Mem"]
            .as_str()
            .unwrap()
            .ends_with(['K', 'M', 'G', 'T']),
        "{info:#}"
    );
    assert!(info.get("Swap").is_some(), "{info:#}");
    assert!(
        info.as_object().unwrap().values().all(Value::is_string),
        "{info:#}"
    );

    // /languages/all: sorted by name, every Judge0 id, none archived here.
    let (status, all) = get_json(&daemon, "/judge0/languages/all", auth).await;
    assert_eq!(status, StatusCode::OK);
    let all = all.as_array().unwrap();
    let names: Vec<&str> = all.iter().map(|l| l["name"].as_str().unwrap()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    assert!(
        all.contains(&json!({"id": 71, "name": "Python (3.11)", "is_archived": false})),
        "{all:?}"
    );
    assert!(all.iter().all(|l| l.as_object().unwrap().len() == 3));
    // Without a key: Judge0's 401, no body.
    let (status, _, text) = send(
        &daemon,
        &call(Method::GET, "/judge0/workers", Auth::None, None, true),
        "/judge0/workers",
    )
    .await;
    assert_eq!((status, text.as_str()), (StatusCode::UNAUTHORIZED, ""));
}

#[tokio::test]
async fn judge0_languages_all_marks_the_languages_no_worker_offers_archived() {
    let redis = RedisServer::start();
    // An API process with the whole catalog, and a worker whose catalog's
    // ruby has no image: nobody offers ruby.
    let dir = tempfile::tempdir().unwrap();
    let catalog = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/runner-images/languages.toml"
    ))
    .unwrap()
    .replace(
        "image = \"code-runner/ruby\"",
        "image = \"code-runner/absent-ruby\"",
    );
    let file = dir.path().join("languages.toml");
    std::fs::write(&file, catalog).unwrap();
    let api = InProcessBuilder::new(Role::Api, &redis).start().await;
    let host = ScriptedHost::new();
    host.set_missing_images(&["code-runner/absent-ruby:latest"]);
    let _worker = InProcessBuilder::new(Role::Worker, &redis)
        .env("CODE_RUNNER_LANGUAGES_FILE", file.display())
        .host(&host)
        .start()
        .await;
    // Once the worker has said which languages it runs (until then the
    // whole catalog is on offer).
    let archived = json!({"id": 72, "name": "Ruby (3.1)", "is_archived": true});
    let all = common::wait_for("ruby archived", Duration::from_secs(20), async || {
        let (status, all) = get_json(&api, "/judge0/languages/all", Auth::Bearer(KEY_A)).await;
        assert_eq!(status, StatusCode::OK, "{all:#}");
        all.as_array().unwrap().contains(&archived).then_some(all)
    })
    .await;
    let all = all.as_array().unwrap();
    assert!(
        all.contains(&json!({"id": 71, "name": "Python (3.11)", "is_archived": false})),
        "{all:?}"
    );
    assert_eq!(
        all.iter().filter(|l| l["is_archived"] == true).count(),
        1,
        "{all:?}"
    );
    // /languages lists only what is on offer.
    let (_, active) = get_json(&api, "/judge0/languages", Auth::Bearer(KEY_A)).await;
    assert!(!active.to_string().contains("Ruby"), "{active:#}");
}
