//! `rediss://`: the daemon talks to Redis over TLS (the redis crate's rustls
//! support), as it must to reach Upstash from outside Fly's private network.
//!
//! A real redis-server with TLS only (plain port closed) on loopback, with a
//! certificate from a CA this test makes ([`common::redis_tls::TlsRedis`]);
//! the daemon trusts that CA through `SSL_CERT_FILE` (read by
//! rustls-native-certs instead of the system store). The refusals of an
//! unknown CA and of a plain URL, which need no Docker, are in the `tools`
//! binary (`tools::redis_tls`).

use crate::common;

use common::daemon::{self, DaemonBuilder, Role};
use common::redis_tls::TlsRedis;
use reqwest::StatusCode;

#[tokio::test]
async fn serve_runs_a_job_through_redis_over_tls() {
    common::init_tracing();
    let redis = TlsRedis::start();
    let url = format!("rediss://localhost:{}", redis.port);
    let server = DaemonBuilder::with_redis_url(Role::Serve, &url)
        .env("SSL_CERT_FILE", redis.ca_file())
        .start()
        .await;

    let ready = server.get("/readyz", None).await;
    assert_eq!(ready.status, StatusCode::OK, "{ready:#?}");

    let answer = server
        .submit_wait(&daemon::python("print('hello over tls')"))
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:#?}");
    assert_eq!(answer.body["status"], "succeeded", "{answer:#?}");
    assert_eq!(daemon::run_stdout(&answer.body), "hello over tls\n");

    // The job really is in the TLS server (the only one this daemon knows).
    let id = answer.id();
    assert_eq!(
        redis
            .cli(&["HGET", &format!("job:{id}"), "status"])
            .as_deref(),
        Some("succeeded")
    );
}
