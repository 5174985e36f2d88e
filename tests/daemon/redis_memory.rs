//! Bounded Redis memory: a flood of jobs that each print
//! their most output (control bytes, which JSON would store as six bytes
//! each) keeps Redis under the bound docs/operations.md computes for one
//! key: the key's storage budget times the allocator and encoding overhead,
//! plus a fixed allowance.
//!
//! Real redis-server, real dockerd, the real binary; every process and
//! container is removed by its guard, also when the test fails.

use crate::common;

use std::time::Duration;

use common::containers::docker;
use common::daemon::{DaemonBuilder, Role, python};
use common::redis_server::RedisServer;
use reqwest::StatusCode;

/// The key's storage budget in this test, MiB.
const BUDGET_MB: u64 = 48;
/// Jobs in one flood (each may need about 2.3 MiB: far more than fit).
const FLOOD: usize = 40;

/// `INFO memory` field `name`, in bytes.
fn memory(redis: &RedisServer, name: &str) -> u64 {
    let value = redis.info("memory", name);
    value
        .parse()
        .unwrap_or_else(|_| panic!("INFO memory {name} is not a number: {value}"))
}

/// The bound of docs/operations.md ("Redis memory"): used memory stays under
/// the Redis's own baseline + 1.5 × the sum of the keys' storage budgets +
/// 16 MiB (store, lists, scripts, client buffers).
fn bound(baseline: u64, budgets: u64) -> u64 {
    baseline + budgets * 3 / 2 + (16 << 20)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_jobs_printing_their_most_output_stays_under_the_bound() {
    let redis = RedisServer::start();
    let docker = docker().await;
    let serve = DaemonBuilder::new(Role::Serve, &redis)
        .env("CODE_RUNNER_KEY_MAX_STORED_MB", BUDGET_MB)
        .env("CODE_RUNNER_WORKER_MAX_SANDBOXES", 4)
        .start()
        .await;
    let baseline = memory(&redis, "used_memory");
    // 1 MiB (the default output limit) of \x01.
    let flood = python("import sys\nsys.stdout.write('\\x01' * (1 << 20))\n");

    let mut accepted = Vec::new();
    let mut refused = 0;
    for round in 0..2 {
        for _ in 0..FLOOD {
            let answer = serve.submit(&flood).await;
            match answer.status {
                StatusCode::ACCEPTED => accepted.push(answer.id()),
                StatusCode::TOO_MANY_REQUESTS => {
                    let (code, message) = answer.error();
                    assert_eq!(code, "key_storage", "{answer:#?}");
                    assert!(
                        message.contains("CODE_RUNNER_KEY_MAX_STORED_MB"),
                        "{message}"
                    );
                    let named = &answer.body["error"]["limit"];
                    assert_eq!(named["value"], BUDGET_MB << 20, "{answer:#?}");
                    let counted = named["counted"].as_u64().unwrap();
                    assert!(counted > BUDGET_MB << 20, "{answer:#?}");
                    common::assert_refusal_detail(
                        &answer.body,
                        30,
                        "key_storage",
                        Some(("CODE_RUNNER_KEY_MAX_STORED_MB", BUDGET_MB << 20, counted)),
                    );
                    refused += 1;
                }
                other => panic!("round {round}: {other}: {answer:#?}"),
            }
        }
        for id in &accepted {
            let view = serve.wait_terminal(id, Duration::from_secs(120)).await;
            assert_eq!(view["status"], "succeeded", "{view:#}");
            let stdout = view["result"]["run"]["stdout"].as_str().unwrap();
            assert_eq!(stdout.len(), 1 << 20);
        }
    }
    let peak = memory(&redis, "used_memory_peak");
    let limit = bound(baseline, BUDGET_MB << 20);
    println!(
        "memory: accepted {} jobs, refused {refused}; baseline {} MiB, peak {} MiB, bound {} MiB",
        accepted.len(),
        baseline >> 20,
        peak >> 20,
        limit >> 20
    );
    assert!(accepted.len() >= 10, "only {} jobs ran", accepted.len());
    assert!(refused >= FLOOD, "the budget refused only {refused}");
    assert!(
        peak <= limit,
        "redis used {} MiB at its peak, over the bound of {} MiB",
        peak >> 20,
        limit >> 20
    );
    serve.assert_no_containers(&docker).await;
}
