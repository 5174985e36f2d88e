//! Several processes on one Redis: an `api` process and `worker` processes,
//! as a fleet runs them.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use common::containers::docker;
use common::daemon;
use common::redis_server::RedisServer;
use daemon::{DaemonBuilder, Role, assert_promtool_passes, metric, python, run_stdout};
use reqwest::StatusCode;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_share_the_queue_and_each_job_runs_exactly_once() {
    let redis = RedisServer::start();
    let api = DaemonBuilder::new(Role::Api, &redis).start().await;
    let (first, second) = tokio::join!(
        DaemonBuilder::new(Role::Worker, &redis)
            .env("CODE_RUNNER_WORKER_MAX_SANDBOXES", 2)
            .start(),
        DaemonBuilder::new(Role::Worker, &redis)
            .env("CODE_RUNNER_WORKER_MAX_SANDBOXES", 2)
            .start()
    );
    let docker = docker().await;

    // Each job echoes a uuid of its own from its stdin.
    let tokens: Vec<String> = (0..20).map(|_| uuid::Uuid::new_v4().to_string()).collect();
    let submissions = tokens.iter().map(|token| {
        let api = &api;
        async move {
            let mut job = python("import sys\nsys.stdout.write(sys.stdin.read())\n");
            job["stdin"] = json!(token);
            let answer = api.submit(&job).await;
            assert_eq!(answer.status, StatusCode::ACCEPTED, "{answer:#?}");
            answer.id()
        }
    });
    let ids = futures_util::future::join_all(submissions).await;
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 20);

    let workers = HashSet::from([first.worker_id.clone(), second.worker_id.clone()]);
    let mut per_worker: HashMap<String, usize> = HashMap::new();
    for (id, token) in ids.iter().zip(&tokens) {
        let view = api.wait_terminal(id, Duration::from_secs(120)).await;
        assert_eq!(view["status"], "succeeded", "{view:#}");
        assert_eq!(run_stdout(&view), token, "{view:#}");
        assert_eq!(view["attempts"], 1, "{view:#}");
        let worker = view["worker"].as_str().unwrap_or_default().to_string();
        assert!(workers.contains(&worker), "unknown worker in {view:#}");
        *per_worker.entry(worker).or_default() += 1;
    }
    eprintln!("jobs per worker: {per_worker:?}");
    if per_worker.len() < 2 {
        eprintln!("note: one worker took every job (timing); not an error");
    }

    // Each worker counts what it ran: together exactly 20, so no job ran twice.
    let mut total = 0.0;
    for worker in [&first, &second] {
        let text = worker.metrics().await;
        assert_promtool_passes(&text);
        assert_eq!(metric(&text, "code_runner_slots_max"), Some(2.0), "{text}");
        let ran = metric(
            &text,
            "code_runner_jobs_total{language=\"python\",status=\"succeeded\"}",
        )
        .unwrap_or(0.0);
        assert_eq!(
            ran,
            per_worker.get(&worker.worker_id).copied().unwrap_or(0) as f64,
            "{text}"
        );
        total += ran;
    }
    assert_eq!(total, 20.0);
    assert_promtool_passes(&api.metrics().await);
    assert_eq!(redis.queue_depth(), 0);
    for worker in [&first, &second] {
        let processing = redis.cli(&["LLEN", &format!("worker:{}:processing", worker.worker_id)]);
        assert_eq!(processing, "0", "{}", worker.worker_id);
        worker.assert_no_containers(&docker).await;
    }
}

#[tokio::test]
async fn a_full_queue_gets_429_with_retry_after_until_a_worker_drains_it() {
    let redis = RedisServer::start();
    // No worker yet: jobs stay queued.
    let api = DaemonBuilder::new(Role::Api, &redis)
        .env("CODE_RUNNER_MAX_QUEUE_DEPTH", 3)
        .start()
        .await;
    let mut ids = Vec::new();
    for i in 0..3 {
        let answer = api.submit(&python(&format!("print({i})"))).await;
        assert_eq!(answer.status, StatusCode::ACCEPTED, "{answer:#?}");
        ids.push(answer.id());
    }
    assert_eq!(redis.queue_depth(), 3);
    for _ in 0..2 {
        let refused = api.submit(&python("print('one too many')")).await;
        assert_eq!(
            refused.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{refused:#?}"
        );
        assert_eq!(refused.error().0, "queue_full");
        assert!(refused.retry_after() >= 1, "{refused:#?}");
    }
    assert_eq!(redis.queue_depth(), 3);
    let text = api.metrics().await;
    assert_eq!(
        metric(&text, "code_runner_queue_depth"),
        Some(3.0),
        "{text}"
    );
    let rejected: f64 = text
        .lines()
        .filter(|l| l.starts_with("code_runner_submissions_rejected_total{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    assert_eq!(rejected, 2.0, "{text}");
    assert_promtool_passes(&text);

    // A worker arrives and drains the queue.
    let worker = DaemonBuilder::new(Role::Worker, &redis).start().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while redis.queue_depth() > 0 {
        assert!(Instant::now() < deadline, "the queue did not drain");
        tokio::time::sleep(daemon::POLL).await;
    }
    let again = api.submit(&python("print('accepted again')")).await;
    assert_eq!(again.status, StatusCode::ACCEPTED, "{again:#?}");
    ids.push(again.id());
    for (i, id) in ids.iter().enumerate() {
        let view = api.wait_terminal(id, Duration::from_secs(60)).await;
        assert_eq!(view["status"], "succeeded", "{view:#}");
        let expected = if i < 3 {
            format!("{i}\n")
        } else {
            "accepted again\n".to_string()
        };
        assert_eq!(run_stdout(&view), expected);
        assert_eq!(view["worker"], worker.worker_id.as_str());
    }
    worker.assert_no_containers(&docker().await).await;
}
