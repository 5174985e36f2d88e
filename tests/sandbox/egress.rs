//! Outbound network by allowlist, end to end in real sandboxes (runc, and
//! runsc when `CODE_RUNNER_TEST_RUNSC=1`): a job's program reaches the
//! hosts its `network.allow` names through the supervisor's relay on the
//! sandbox's loopback and the worker's egress proxy, and nothing else.
//!
//! Loopback only: the upstream servers run in this test on 127.0.0.1, and
//! the engine's test-only resolver (`CODE_RUNNER_TEST_EGRESS_HOSTS`) maps
//! `upstream.test` to them; `private.test` (10.0.0.1) and `metadata.test`
//! (169.254.169.254) are refused by the address policy before any connect.
//! The one connect a program makes past its loopback goes to 192.0.2.1
//! (TEST-NET-1), which a sandbox without a route cannot send a packet to.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use code_runner::config::SandboxSettings;
use code_runner::egress::EgressEvent;
use code_runner::job::{Encoding, FileSpec, JobSpec, NetworkRequest, Status};
use code_runner::sandbox::SandboxEvent;
use common::{Harness, default_settings, job, runsc_enabled, stdout};

/// Bytes `/big` answers with: more than the byte cap of [`capped`].
const BIG: usize = 4 << 20;

/// An HTTP/1.1 server on 127.0.0.1 (plain, or TLS for `upstream.test`)
/// that answers `/hello` and `/big` and records each request line. Its
/// threads end with the test process; the listener closes when dropped.
struct Upstream {
    port: u16,
    requests: Arc<Mutex<Vec<String>>>,
}

/// The test CA's PEM and a rustls config for `upstream.test` signed by it.
fn tls() -> (String, Arc<rustls::ServerConfig>) {
    let certs = common::certs::test_certs("code-runner egress test CA", &["upstream.test"]);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![certs.server_der.into()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(certs.key_der.into()),
        )
        .unwrap();
    (certs.ca_pem, Arc::new(config))
}

impl Upstream {
    fn start(tls: Option<Arc<rustls::ServerConfig>>) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&requests);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let seen = Arc::clone(&seen);
                let tls = tls.clone();
                std::thread::spawn(move || {
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(20)));
                    match tls {
                        None => answer(stream, &seen),
                        Some(config) => {
                            let Ok(connection) = rustls::ServerConnection::new(config) else {
                                return;
                            };
                            answer(rustls::StreamOwned::new(connection, stream), &seen);
                        }
                    }
                });
            }
        });
        Upstream { port, requests }
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

/// Reads one request head and answers it, then closes.
fn answer(mut stream: impl Read + Write, seen: &Mutex<Vec<String>>) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let line = head.lines().next().unwrap_or_default().to_string();
    seen.lock().unwrap().push(line.clone());
    let body: Vec<u8> = if line.contains(" /big ") {
        vec![b'x'; BIG]
    } else {
        format!("hello from upstream: {line}").into_bytes()
    };
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(&body);
    let _ = stream.flush();
}

/// The engine settings of these tests: the test resolver, and `tune`.
fn settings(runtime: &str, tune: impl FnOnce(&mut SandboxSettings)) -> SandboxSettings {
    let mut settings = default_settings(Some(runtime));
    settings.test_egress_hosts =
        Some("upstream.test=127.0.0.1,private.test=10.0.0.1,metadata.test=169.254.169.254".into());
    tune(&mut settings);
    settings
}

/// The runtimes to test: runc, and runsc when enabled.
fn runtimes(test: &str) -> Vec<&'static str> {
    if runsc_enabled() {
        vec!["runc", "runsc"]
    } else {
        println!("{test}: runsc part skipped (CODE_RUNNER_TEST_RUNSC is not 1)");
        vec!["runc"]
    }
}

/// A python job allowed `allow`, with `files` beside `main.py` and `args`.
fn network_job(source: &str, allow: &[String], files: &[(&str, &str)], args: &[String]) -> JobSpec {
    let mut spec = job("python", "main.py", source);
    for (name, content) in files {
        spec.files.push(FileSpec {
            name: name.to_string(),
            content: content.to_string(),
            encoding: Encoding::Utf8,
            reference: None,
        });
    }
    spec.args = args.to_vec();
    spec.network = Some(NetworkRequest {
        allow: allow.to_vec(),
    });
    spec
}

/// The egress events of a run, in order.
fn egress_events(events: &[SandboxEvent]) -> Vec<EgressEvent> {
    events
        .iter()
        .filter_map(|e| match e {
            SandboxEvent::Egress(event) => Some(event.clone()),
            _ => None,
        })
        .collect()
}

/// What a program prints for each attempt: the answer, the HTTP status of
/// a refusal, or the error.
const PROBE: &str = r#"
import errno, os, socket, ssl, sys, urllib.error, urllib.request

plain, secure = int(sys.argv[1]), int(sys.argv[2])

def show(name, attempt):
    try:
        print(name, attempt())
    except urllib.error.HTTPError as e:
        print(name, "HTTP", e.code)
    except urllib.error.URLError as e:
        print(name, "URLError", e.reason)
    except OSError as e:
        print(name, errno.errorcode.get(e.errno, e.errno) if e.errno else e)
    sys.stdout.flush()

def get(url, **kw):
    return urllib.request.urlopen(url, timeout=10, **kw).read().decode()

show("proxy", lambda: os.environ["HTTP_PROXY"] + " " + os.environ["https_proxy"])
show("http", lambda: get(f"http://upstream.test:{plain}/hello"))
context = ssl.create_default_context(cafile="ca.pem")
show("https", lambda: get(f"https://upstream.test:{secure}/secure", context=context))
show("other host", lambda: get(f"http://other.test:{plain}/"))
show("other port", lambda: get(f"http://upstream.test:{plain + 1}/"))
show("private", lambda: get(f"http://private.test:{plain}/"))
show("metadata", lambda: get("http://metadata.test/latest/meta-data/"))

def direct(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect((host, port))
        return "connected"
    finally:
        s.close()

# Without the proxy: the host's upstream is not on the sandbox's loopback,
# and there is no route anywhere else.
show("direct loopback", lambda: direct("127.0.0.1", plain))
show("direct", lambda: direct("192.0.2.1", 80))
show("interfaces", lambda: sorted(os.listdir("/sys/class/net")))
"#;

#[tokio::test]
async fn a_job_reaches_its_allowed_hosts_through_the_proxy_and_nothing_else() {
    let (ca, tls) = tls();
    let plain = Upstream::start(None);
    let secure = Upstream::start(Some(tls));
    for runtime in runtimes("egress") {
        let harness = Harness::with_settings(settings(runtime, |_| {})).await;
        let allow = [
            format!("upstream.test:{}", plain.port),
            format!("upstream.test:{}", secure.port),
            format!("private.test:{}", plain.port),
            "metadata.test".to_string(),
        ];
        let args = [plain.port.to_string(), secure.port.to_string()];
        let spec = network_job(PROBE, &allow, &[("ca.pem", &ca)], &args);
        let (result, events) = harness.run_collecting(&spec).await;
        assert_eq!(result.status, Status::Succeeded, "{runtime}: {result:#?}");
        let (p, s) = (plain.port, secure.port);
        assert_eq!(
            stdout(&result),
            format!(
                "proxy http://127.0.0.1:3128 http://127.0.0.1:3128\n\
                 http hello from upstream: GET /hello HTTP/1.1\n\
                 https hello from upstream: GET /secure HTTP/1.1\n\
                 other host HTTP 403\n\
                 other port HTTP 403\n\
                 private HTTP 403\n\
                 metadata HTTP 403\n\
                 direct loopback ECONNREFUSED\n\
                 direct {}\n\
                 interfaces ['lo']\n",
                // gVisor has no route either, and says so its own way.
                if runtime == "runsc" {
                    "EHOSTUNREACH"
                } else {
                    "ENETUNREACH"
                }
            ),
            "{runtime}"
        );
        // The upstream saw the plain request in origin form, and the TLS
        // one inside its tunnel: nothing else reached either.
        assert!(
            plain
                .requests()
                .ends_with(&["GET /hello HTTP/1.1".to_string()]),
            "{:?}",
            plain.requests()
        );
        assert!(
            secure
                .requests()
                .ends_with(&["GET /secure HTTP/1.1".to_string()])
        );

        let events = egress_events(&events);
        let summary: Vec<(String, u16, bool, Option<String>)> = events
            .iter()
            .map(|e| (e.host.clone(), e.port, e.allowed, e.reason.clone()))
            .collect();
        let refused = |host: &str, port: u16, reason: &str| {
            (host.to_string(), port, false, Some(reason.to_string()))
        };
        assert_eq!(
            summary,
            [
                ("upstream.test".to_string(), p, true, None),
                ("upstream.test".to_string(), s, true, None),
                refused("other.test", p, "not_allowed"),
                refused("upstream.test", p + 1, "not_allowed"),
                refused("private.test", p, "forbidden_address"),
                refused("metadata.test", 80, "forbidden_address"),
            ],
            "{runtime}: {events:#?}"
        );
        let private = &events[4];
        assert_eq!(private.address, Some("10.0.0.1".parse().unwrap()));
        assert_eq!(events[5].address, Some("169.254.169.254".parse().unwrap()));
        let allowed = &events[0];
        assert_eq!(allowed.address, Some("127.0.0.1".parse().unwrap()));
        assert!(
            allowed.bytes_up > 0 && allowed.bytes_down > 0,
            "{allowed:?}"
        );
        let totals = result
            .egress
            .expect("a job with network reports its egress");
        assert_eq!((totals.connections, totals.refused), (6, 4), "{runtime}");
        assert_eq!(
            totals.bytes_down,
            events.iter().map(|e| e.bytes_down).sum::<u64>()
        );
        harness.assert_clean().await;
    }
}

#[tokio::test]
async fn a_flood_through_the_proxy_hits_its_caps() {
    let plain = Upstream::start(None);
    for runtime in runtimes("egress caps") {
        let harness = Harness::with_settings(settings(runtime, |s| {
            s.egress_max_mb = 1;
            s.egress_max_connections = 4;
        }))
        .await;
        let source = r#"
import sys, urllib.error, urllib.request
port = int(sys.argv[1])
try:
    body = urllib.request.urlopen(f"http://upstream.test:{port}/big", timeout=10).read()
    print("big", len(body))
except Exception as e:
    print("big cut", type(e).__name__)
for i in range(5):
    try:
        print(i, urllib.request.urlopen(f"http://upstream.test:{port}/hello", timeout=10).status)
    except urllib.error.HTTPError as e:
        print(i, "HTTP", e.code)
"#;
        let allow = [format!("upstream.test:{}", plain.port)];
        let spec = network_job(source, &allow, &[], &[plain.port.to_string()]);
        let (result, events) = harness.run_collecting(&spec).await;
        assert_eq!(result.status, Status::Succeeded, "{runtime}: {result:#?}");
        // The download is cut at the byte cap (1 MiB of a 4 MiB body), and
        // the allowance is spent: every later connection is refused, the
        // ones past the connection cap (4, the first included) for that.
        assert_eq!(
            stdout(&result),
            "big cut IncompleteRead\n0 HTTP 429\n1 HTTP 429\n2 HTTP 429\n3 HTTP 429\n4 HTTP 429\n",
            "{runtime}"
        );
        let reasons: Vec<Option<String>> = egress_events(&events)
            .iter()
            .map(|e| e.reason.clone())
            .collect();
        let reason = |r: &str| Some(r.to_string());
        assert_eq!(
            reasons,
            [
                reason("byte_cap"),
                reason("byte_cap"),
                reason("byte_cap"),
                reason("byte_cap"),
                reason("connection_cap"),
                reason("connection_cap"),
            ],
            "{runtime}"
        );
        let totals = result.egress.unwrap();
        assert_eq!(
            totals.bytes_up + totals.bytes_down,
            1 << 20,
            "{runtime}: {totals:?}"
        );
        assert_eq!((totals.connections, totals.refused), (6, 5));
        harness.assert_clean().await;
    }
}

#[tokio::test]
async fn a_job_without_network_has_none_and_no_socket() {
    let plain = Upstream::start(None);
    for runtime in runtimes("no egress") {
        let harness = Harness::with_settings(settings(runtime, |_| {})).await;
        let source = r#"
import os, socket, sys
print(sorted(k for k in os.environ if "proxy" in k.lower()))
print(os.path.exists("/run/code-runner-egress"))
s = socket.socket()
print(s.connect_ex(("127.0.0.1", 3128)) != 0)
"#;
        let mut spec = job("python", "main.py", source);
        spec.args = vec![plain.port.to_string()];
        let (result, events) = harness.run_collecting(&spec).await;
        assert_eq!(
            stdout(&result),
            "[]\nFalse\nTrue\n",
            "{runtime}: {result:#?}"
        );
        assert_eq!(result.egress, None);
        assert!(egress_events(&events).is_empty());
        harness.assert_clean().await;
    }
}

#[tokio::test]
async fn a_job_sees_only_its_own_socket_and_it_is_gone_after_the_job() {
    for runtime in runtimes("egress socket") {
        let dir = tempfile::tempdir().unwrap();
        let egress_dir = dir.path().to_path_buf();
        let harness = Harness::with_settings(settings(runtime, |s| {
            s.egress_dir = egress_dir.clone();
        }))
        .await;
        // Lists what the sandbox can see of the egress directories, and
        // tries to write into its own.
        let source = r#"
import os
print(sorted(os.listdir("/run/code-runner-egress")))
try:
    open("/run/code-runner-egress/other.sock", "w")
except OSError as e:
    print("write", e.strerror)
"#;
        let allow = ["upstream.test".to_string()];
        let spec = network_job(source, &allow, &[], &[]);
        let (first, second) = tokio::join!(harness.run(&spec), harness.run(&spec));
        // The directory is read-only (and root's): Linux checks the mount
        // first, gVisor the permission first.
        let refusal = if runtime == "runsc" {
            "Permission denied"
        } else {
            "Read-only file system"
        };
        for result in [&first, &second] {
            assert_eq!(
                stdout(result),
                format!("['proxy.sock']\nwrite {refusal}\n"),
                "{runtime}: {result:#?}"
            );
        }
        // Both jobs' directories are gone; the engine's own stays, empty.
        let engines: Vec<_> = std::fs::read_dir(&egress_dir).unwrap().collect();
        assert_eq!(engines.len(), 1, "{runtime}");
        let engine = engines[0].as_ref().unwrap().path();
        assert_eq!(std::fs::read_dir(&engine).unwrap().count(), 0, "{runtime}");
        harness.assert_clean().await;
    }
}

mod through_the_api {
    use super::*;
    use common::daemon::{self, DaemonBuilder, KEY_A, KEY_B, Role, curl_events, sse_events};
    use common::redis_server::RedisServer;
    use reqwest::StatusCode;
    use serde_json::{Value, json};

    fn python(source: &str, allow: Value) -> Value {
        json!({
            "language": "python",
            "files": [{"name": "main.py", "content": source}],
            "network": {"allow": allow},
        })
    }

    /// `(status, field, message)` of a refused submission.
    async fn refusal(
        daemon: &daemon::Daemon,
        key: &str,
        job: &Value,
    ) -> (StatusCode, String, String) {
        let answer = daemon.submit_as(Some(key), job, false).await;
        let (code, message) = answer.error();
        assert_eq!(code, "invalid_job", "{answer:#?}");
        let field = answer.body["error"]["field"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        (answer.status, field, message)
    }

    #[tokio::test]
    async fn a_key_allows_its_jobs_the_hosts_it_lists_and_says_which_it_does_not() {
        let upstream = Upstream::start(None);
        let redis = RedisServer::start();
        let port = upstream.port;
        let server = DaemonBuilder::new(Role::Serve, &redis)
            .env(
                "CODE_RUNNER_KEY_EGRESS",
                format!("a=upstream.test:{port} *.example.edu"),
            )
            .env("CODE_RUNNER_TEST_EGRESS_HOSTS", "upstream.test=127.0.0.1")
            .start()
            .await;
        let fetch = format!(
            "import urllib.request\nprint(urllib.request.urlopen('http://upstream.test:{port}/hello', timeout=10).read().decode())\n"
        );

        // Refusals name the host and the key; nothing is queued.
        let allowed = json!([format!("upstream.test:{port}")]);
        assert_eq!(
            refusal(&server, KEY_B, &python(&fetch, allowed.clone())).await,
            (
                StatusCode::BAD_REQUEST,
                "network.allow".into(),
                "the api key \"b\" allows no outbound network (CODE_RUNNER_KEY_EGRESS)".into()
            )
        );
        assert_eq!(
            refusal(&server, KEY_A, &python(&fetch, json!(["pypi.org"]))).await,
            (
                StatusCode::BAD_REQUEST,
                "network.allow".into(),
                "pypi.org is not in the key's egress allowlist".into()
            )
        );
        // A port the key's entry does not give, and a wildcard wider than the key's.
        assert_eq!(
            refusal(&server, KEY_A, &python(&fetch, json!(["upstream.test"])))
                .await
                .2,
            "upstream.test is not in the key's egress allowlist"
        );
        assert_eq!(
            refusal(&server, KEY_A, &python(&fetch, json!(["*.edu"])))
                .await
                .2,
            "*.edu is not in the key's egress allowlist"
        );
        assert_eq!(
            refusal(
                &server,
                KEY_A,
                &python(&fetch, json!(["lab.example.edu", "10.0.0.1"]))
            )
            .await,
            (
                StatusCode::BAD_REQUEST,
                "network.allow[1]".into(),
                "\"10.0.0.1\" is an IP address; name a host".into()
            )
        );
        let mut unknown = python(&fetch, allowed.clone());
        unknown["network"]["deny"] = json!([]);
        let answer = server.submit_as(Some(KEY_A), &unknown, false).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:#?}");
        assert!(
            answer.error().1.contains("unknown field `deny`"),
            "{answer:#?}"
        );
        let queued = server.get("/v1/jobs", Some(KEY_A)).await;
        assert_eq!(queued.body["jobs"], json!([]), "{queued:#?}");

        // Within the key's list: the job runs, reaches its host, and its
        // record, stream and the metrics say so.
        let answer = server
            .submit_as(Some(KEY_A), &python(&fetch, allowed), true)
            .await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:#?}");
        let view = &answer.body;
        assert_eq!(view["status"], "succeeded", "{view:#?}");
        assert_eq!(
            daemon::run_stdout(view),
            "hello from upstream: GET /hello HTTP/1.1\n"
        );
        assert_eq!(view["result"]["egress"]["connections"], 1, "{view:#?}");
        assert_eq!(view["result"]["egress"]["refused"], 0);
        let down = view["result"]["egress"]["bytes_down"].as_u64().unwrap();
        assert!(down > 0);
        assert_eq!(view["result"]["start"], "cold", "{view:#?}");

        let id = answer.id();
        let (text, code) = curl_events(
            &server,
            &id,
            "",
            &[format!("Authorization: Bearer {KEY_A}")],
        )
        .await;
        assert_eq!(code, "200");
        let egress: Vec<Value> = sse_events(&text)
            .into_iter()
            .filter(|(_, event, _)| event == "egress")
            .map(|(_, _, data)| data)
            .collect();
        assert_eq!(egress.len(), 1, "{text}");
        let event = &egress[0];
        assert_eq!(
            (
                &event["host"],
                &event["port"],
                &event["address"],
                &event["allowed"]
            ),
            (
                &json!("upstream.test"),
                &json!(port),
                &json!("127.0.0.1"),
                &json!(true)
            ),
            "{event}"
        );
        assert_eq!(event["bytes_down"], json!(down));

        let metrics = server.metrics().await;
        assert_eq!(
            daemon::metric(
                &metrics,
                "code_runner_egress_connections_total{verdict=\"allowed\"}"
            ),
            Some(1.0),
            "{metrics}"
        );
        assert_eq!(
            daemon::metric(
                &metrics,
                "code_runner_egress_bytes_total{direction=\"down\"}"
            ),
            Some(down as f64)
        );
        server
            .assert_no_containers(&common::containers::docker().await)
            .await;
    }
}
