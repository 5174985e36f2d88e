//! `rediss://` refused: a Redis whose certificate comes from a CA the
//! daemon does not trust, and a plain `redis://` URL to a server that
//! speaks only TLS, each stop an `api` process at its start with exit 69
//! and an error that says why. (A job run through Redis over TLS is in the
//! `daemon` binary: `daemon::redis_tls`.)

use crate::common;

use common::daemon;
use common::redis_server::free_port;
use common::redis_tls::TlsRedis;

#[tokio::test]
async fn a_redis_certificate_from_an_unknown_ca_is_refused_with_a_clear_error() {
    common::init_tracing();
    let redis = TlsRedis::start();
    let url = format!("rediss://localhost:{}", redis.port);
    // No SSL_CERT_FILE: the system's roots do not know the test's CA.
    let empty_roots = tempfile::NamedTempFile::new().unwrap();
    let output = daemon::run_to_end(
        &["api"],
        &[
            ("CODE_RUNNER_REDIS_URL", url.as_str()),
            ("CODE_RUNNER_API_KEYS", "a:key-a-0123456789"),
            ("CODE_RUNNER_LISTEN", &format!("127.0.0.1:{}", free_port())),
            ("SSL_CERT_FILE", &empty_roots.path().to_string_lossy()),
        ],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(69), "stderr: {stderr}");
    assert!(
        stderr.contains("cannot set up attach tokens") && stderr.contains("UnknownIssuer"),
        "the error names the refused certificate: {stderr}"
    );
}

#[tokio::test]
async fn a_plain_redis_url_to_a_tls_only_server_fails_clearly() {
    common::init_tracing();
    let redis = TlsRedis::start();
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let output = daemon::run_to_end(
        &["api"],
        &[
            ("CODE_RUNNER_REDIS_URL", url.as_str()),
            ("CODE_RUNNER_API_KEYS", "a:key-a-0123456789"),
            ("CODE_RUNNER_LISTEN", &format!("127.0.0.1:{}", free_port())),
        ],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(69), "stderr: {stderr}");
    assert!(
        stderr.contains("cannot set up attach tokens"),
        "stderr: {stderr}"
    );
}
