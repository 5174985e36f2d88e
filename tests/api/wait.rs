//! `POST /v1/jobs?wait=true` on the API alone ([`crate::server`]), the
//! test playing the worker: the result when the job ends in time, the
//! job's status when time is up, an answer as soon as the `exit` event is
//! written, and a shutdown that ends a waiting request.

use std::time::{Duration, Instant};

use reqwest::StatusCode;

use crate::common;
use crate::common::client::python;
use crate::server::{BOB, KEYS, Setup, answer, succeeded};

#[tokio::test]
async fn wait_returns_the_result_or_the_status_when_time_is_up() {
    let api = Setup {
        max_wait: Duration::from_millis(300),
        ..Setup::new(KEYS)
    }
    .start()
    .await;

    // Nobody runs it: after max_wait, 202 with the job's status.
    let started = Instant::now();
    let response = api
        .http
        .post(api.url("/v1/jobs?wait=true"))
        .bearer_auth(BOB)
        .json(&python("print(1)"))
        .send()
        .await
        .unwrap();
    let (status, _, view) = answer(response).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{view}");
    assert_eq!(view["status"], "queued");
    assert!(view["token"].is_string());
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(started.elapsed() < Duration::from_secs(5));
    let waiting = view["id"].as_str().unwrap().to_string();
    // Drop it from the queue so the "worker" below takes the next one.
    let (status, _, _) = answer(api.delete(BOB, &format!("/v1/jobs/{waiting}")).await).await;
    assert_eq!(status, StatusCode::OK);

    // A worker finishes it while the client waits: 200 with the result.
    let api = Setup::new(KEYS).start().await;
    let worker = async {
        let deadline = Instant::now() + Duration::from_secs(10);
        while api.queued_ids().await.is_empty() {
            assert!(Instant::now() < deadline, "the job was never queued");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let id = common::claim_and_start(&api.store, "w1").await;
        api.store
            .jobs()
            .finish(&id, "w1", 1, &succeeded())
            .await
            .unwrap();
    };
    let submit = async {
        api.http
            .post(api.url("/v1/jobs?wait=true"))
            .bearer_auth(BOB)
            .json(&python("print(1)"))
            .send()
            .await
            .unwrap()
    };
    let ((), response) = tokio::join!(worker, submit);
    let (status, _, view) = answer(response).await;
    assert_eq!(status, StatusCode::OK, "{view}");
    assert_eq!(view["status"], "succeeded");
    assert_eq!(view["result"]["status"], "succeeded");
    assert!(view["token"].is_string());
}

/// `?wait=true` wakes on the job's `exit` event, not on a timer: the answer
/// comes within a few ms of the moment the result (with its `exit` event)
/// is written, whenever in a poll period that moment falls. Nine rounds,
/// each finishing the job at a different offset; the median gap must stay
/// under 25 ms (a 100 ms poll would give a median of about 50 ms).
#[tokio::test]
async fn wait_answers_as_soon_as_the_exit_event_is_written() {
    let api = Setup::new(KEYS).start().await;
    let mut gaps = Vec::new();
    for round in 0..9u64 {
        let worker = async {
            let deadline = Instant::now() + Duration::from_secs(10);
            while api.queued_ids().await.is_empty() {
                assert!(Instant::now() < deadline, "the job was never queued");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let id = common::claim_and_start(&api.store, "w1").await;
            // Let the waiting request block on the events, then finish at
            // an offset that moves through a poll period.
            tokio::time::sleep(Duration::from_millis(150 + round * 11)).await;
            api.store
                .jobs()
                .finish(&id, "w1", 1, &succeeded())
                .await
                .unwrap();
            Instant::now()
        };
        let submit = async {
            let response = api
                .http
                .post(api.url("/v1/jobs?wait=true"))
                .bearer_auth(BOB)
                .json(&python("print(1)"))
                .send()
                .await
                .unwrap();
            (Instant::now(), response)
        };
        let (finished, (answered, response)) = tokio::join!(worker, submit);
        let (status, _, view) = answer(response).await;
        assert_eq!(status, StatusCode::OK, "{view}");
        assert_eq!(view["status"], "succeeded");
        assert!(answered >= finished, "answered before the job ended");
        gaps.push(answered - finished);
    }
    gaps.sort();
    assert!(
        gaps[gaps.len() / 2] < Duration::from_millis(25),
        "the answers came late after the exit events: {gaps:?}"
    );
}

#[tokio::test]
async fn shutdown_ends_a_waiting_submit_and_the_server() {
    let mut api = Setup {
        max_wait: Duration::from_secs(60),
        ..Setup::new(KEYS)
    }
    .start()
    .await;
    let request = api
        .http
        .post(api.url("/v1/jobs?wait=true"))
        .bearer_auth(BOB)
        .json(&python("print(1)"))
        .send();
    let stop = async {
        let deadline = Instant::now() + Duration::from_secs(10);
        while api.queued_ids().await.is_empty() {
            assert!(Instant::now() < deadline, "the job was never queued");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        api.shutdown.cancel();
    };
    let started = Instant::now();
    let (response, ()) = tokio::join!(request, stop);
    let (status, _, view) = answer(response.unwrap()).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{view}");
    assert_eq!(view["status"], "queued");
    assert!(started.elapsed() < Duration::from_secs(10));
    let server = api.server.take().unwrap();
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the server stops")
        .unwrap()
        .unwrap();
}
