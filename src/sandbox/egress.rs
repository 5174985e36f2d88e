//! A job's egress, the engine's part: the job's proxy ([`crate::egress`]) on
//! a Unix socket of its own, in a directory mounted into its sandbox only.
//!
//! Each engine keeps its jobs' sockets under `<dir>/range-<first uid>/`:
//! the engine holds its uid range's lock for its life ([`super::uids`]), so
//! whatever that directory holds when an engine takes the range was left by
//! a previous holder that died, and is removed ([`clear_stale`]). A job's
//! directory (`<job id>-<suffix>`, holding `proxy.sock`) is created when its
//! cold start begins and removed when the job ends ([`JobEgress::finish`],
//! or on drop), with the proxy stopped first. The sandbox sees it read-only
//! at [`EGRESS_MOUNT`], where its supervisor's relay connects.

use std::collections::HashMap;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::UnixListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::SandboxEvent;
use crate::egress::{Allowlist, EgressHandle, EgressPolicy, EgressTotals, Resolver, is_forbidden};
use crate::job::{EGRESS_MOUNT, EGRESS_SOCKET};

/// Where the engines of a host keep their jobs' egress sockets by default
/// (cleared at boot, beside the uid range locks).
pub const DEFAULT_EGRESS_DIR: &str = "/run/code-runner/egress";

/// How the engine runs its jobs' egress proxies.
#[derive(Debug, Clone)]
pub struct EgressConfig {
    /// The host directory of the engines' per-job socket directories.
    pub dir: PathBuf,
    /// The OCI runtime of a sandbox with egress when the operator named
    /// one (`CODE_RUNNER_EGRESS_RUNTIME`); `None`: [`egress_runtime`]'s
    /// default for the sandboxes' runtime.
    pub runtime: Option<String>,
    /// Bytes one job may relay, both ways, over its life.
    pub max_bytes: u64,
    /// Connections one job may open over its life (refused ones count).
    pub max_connections: u32,
    /// Tests only (`CODE_RUNNER_TEST_EGRESS_HOSTS`): fixed answers for
    /// these names instead of the system resolver (any other name does not
    /// resolve), and loopback let through. Every address here is one the
    /// policy forbids otherwise (loopback, private, link-local…), never a
    /// public one: the switch cannot send traffic past loopback.
    pub test_hosts: Option<HashMap<String, Vec<IpAddr>>>,
    /// Why this engine cannot give jobs a network (its runtime is not
    /// registered with Docker): such a job ends `error` saying so.
    pub unavailable: Option<String>,
}

/// The OCI runtime of a sandbox with egress, when the others run under
/// `sandbox_runtime` (`None`: Docker's default): the operator's choice,
/// else the same runtime, but for gVisor `runsc-egress`. gVisor refuses a
/// connect to a host socket unless runsc runs with `--host-uds=open`, so
/// those sandboxes use a runtime of their own registered with it, and no
/// other sandbox gets that door.
pub fn egress_runtime(config: &EgressConfig, sandbox_runtime: Option<&str>) -> Option<String> {
    config.runtime.clone().or_else(|| {
        sandbox_runtime.map(|runtime| match runtime {
            "runsc" => "runsc-egress".to_string(),
            other => other.to_string(),
        })
    })
}

impl Default for EgressConfig {
    /// 64 MiB and 256 connections per job, the default directory.
    fn default() -> Self {
        Self {
            dir: PathBuf::from(DEFAULT_EGRESS_DIR),
            runtime: None,
            max_bytes: 64 << 20,
            max_connections: 256,
            test_hosts: None,
            unavailable: None,
        }
    }
}

impl EgressConfig {
    /// The policy of a job allowed `allow`.
    fn policy(&self, allow: &Allowlist) -> EgressPolicy {
        let mut policy = EgressPolicy::new(allow.clone());
        policy.max_bytes = self.max_bytes;
        policy.max_connections = self.max_connections;
        if let Some(hosts) = &self.test_hosts {
            policy.resolver = Resolver::Static(hosts.clone());
            policy.allow_loopback_for_tests = true;
        }
        policy
    }
}

/// Parses `CODE_RUNNER_TEST_EGRESS_HOSTS`: `name=address,…` (a name may
/// come more than once for several addresses). Only addresses the policy
/// forbids are accepted: loopback (which the switch lets through) and the
/// ranges that show the policy refusing (private, link-local, …).
pub fn parse_test_hosts(text: &str) -> Result<HashMap<String, Vec<IpAddr>>, String> {
    let mut hosts: HashMap<String, Vec<IpAddr>> = HashMap::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, address) = entry
            .split_once('=')
            .ok_or_else(|| format!("{entry:?} is not name=address"))?;
        let address: IpAddr = address
            .trim()
            .parse()
            .map_err(|_| format!("{entry:?}: {address:?} is not an IP address"))?;
        if is_forbidden(address).is_none() {
            return Err(format!(
                "{entry:?}: {address} is a public address; this test switch takes loopback or other non-public addresses only"
            ));
        }
        hosts
            .entry(name.trim().to_ascii_lowercase())
            .or_default()
            .push(address);
    }
    Ok(hosts)
}

/// This engine's socket directories: `<dir>/range-<first uid>`.
pub(super) fn engine_dir(config: &EgressConfig, range_first: u32) -> PathBuf {
    config.dir.join(format!("range-{range_first}"))
}

/// Removes what a previous holder of this engine's uid range left under
/// `engine_dir` (it died, or the range would not be free).
pub(super) fn clear_stale(engine_dir: &Path) {
    match std::fs::remove_dir_all(engine_dir) {
        Ok(()) => {
            tracing::info!(dir = %engine_dir.display(), "removed the egress sockets a previous engine left")
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => {
            tracing::warn!(dir = %engine_dir.display(), %error, "cannot remove the egress sockets a previous engine left")
        }
    }
}

/// A job's running egress proxy and its socket directory.
#[derive(Debug)]
pub(super) struct JobEgress {
    dir: PathBuf,
    handle: Option<EgressHandle>,
    forward: Option<JoinHandle<()>>,
}

impl JobEgress {
    /// Creates `<engine_dir>/<name>/proxy.sock` and serves the job's
    /// proxy on it; each connection's event goes to `events` as
    /// [`SandboxEvent::Egress`] when it ends.
    pub(super) fn start(
        config: &EgressConfig,
        engine_dir: &Path,
        name: &str,
        allow: &Allowlist,
        events: Option<mpsc::Sender<SandboxEvent>>,
    ) -> Result<JobEgress, String> {
        let dir = engine_dir.join(name);
        let fail = |what: &str, error: std::io::Error| {
            format!(
                "cannot {what} for the job's egress proxy ({}): {error}",
                dir.display()
            )
        };
        std::fs::create_dir_all(engine_dir).map_err(|e| fail("create the socket directory", e))?;
        // The name has a random suffix: no other attempt's directory is
        // there (an existing one is an error, not something to remove).
        std::fs::create_dir(&dir).map_err(|e| fail("create the socket directory", e))?;
        // Mounted into the sandbox: its supervisor (uid 0 without
        // capabilities, not the directory's owner when the worker is not
        // root) must be able to reach the socket.
        let mode = |path: &Path, mode: u32| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        };
        // From here on, dropping it removes the directory again.
        let mut created = JobEgress {
            dir: dir.clone(),
            handle: None,
            forward: None,
        };
        mode(&dir, 0o755).map_err(|e| fail("open the socket directory", e))?;
        let socket = dir.join(EGRESS_SOCKET);
        let listener = UnixListener::bind(&socket).map_err(|e| fail("bind the socket", e))?;
        mode(&socket, 0o666).map_err(|e| fail("open the socket", e))?;
        let (handle, mut connections) =
            EgressHandle::start(listener, Arc::new(config.policy(allow)));
        let forward = tokio::spawn(async move {
            while let Some(event) = connections.recv().await {
                if let Some(events) = &events {
                    let _ = events.send(SandboxEvent::Egress(event)).await;
                }
            }
        });
        created.handle = Some(handle);
        created.forward = Some(forward);
        Ok(created)
    }

    /// The host directory to mount at [`EGRESS_MOUNT`].
    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stops the proxy (ending open connections), waits until every
    /// connection's event was handed on, removes the socket directory and
    /// returns what the job used.
    pub(super) async fn finish(mut self) -> EgressTotals {
        let totals = match self.handle.take() {
            Some(handle) => handle.stop().await,
            None => EgressTotals::default(),
        };
        if let Some(forward) = self.forward.take() {
            let _ = forward.await;
        }
        totals
    }
}

impl Drop for JobEgress {
    fn drop(&mut self) {
        // Dropping the handle stops the proxy; the forwarder ends with it.
        self.handle.take();
        if let Err(error) = std::fs::remove_dir_all(&self.dir)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %self.dir.display(), %error, "cannot remove a job's egress socket directory");
        }
    }
}

/// The bind of a job's socket directory into its sandbox.
pub(super) fn bind(host_dir: &Path) -> String {
    format!("{}:{EGRESS_MOUNT}:ro", host_dir.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_hosts_take_only_addresses_the_policy_forbids() {
        let hosts =
            parse_test_hosts("Upstream.test=127.0.0.1, private.test=10.0.0.1,upstream.test=::1")
                .unwrap();
        assert_eq!(
            hosts["upstream.test"],
            [
                "127.0.0.1".parse::<IpAddr>().unwrap(),
                "::1".parse().unwrap()
            ]
        );
        assert_eq!(
            hosts["private.test"],
            ["10.0.0.1".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(
            parse_test_hosts("a.test=8.8.8.8").unwrap_err(),
            "\"a.test=8.8.8.8\": 8.8.8.8 is a public address; this test switch takes loopback or other non-public addresses only"
        );
        assert_eq!(
            parse_test_hosts("a.test").unwrap_err(),
            "\"a.test\" is not name=address"
        );
        assert_eq!(
            parse_test_hosts("a.test=local").unwrap_err(),
            "\"a.test=local\": \"local\" is not an IP address"
        );
    }

    #[test]
    fn gvisor_sandboxes_with_egress_use_a_runtime_of_their_own() {
        let default = EgressConfig::default();
        assert_eq!(egress_runtime(&default, None), None);
        assert_eq!(
            egress_runtime(&default, Some("runsc")).as_deref(),
            Some("runsc-egress")
        );
        assert_eq!(
            egress_runtime(&default, Some("kata")).as_deref(),
            Some("kata")
        );
        let named = EgressConfig {
            runtime: Some("gvisor-uds".into()),
            ..EgressConfig::default()
        };
        assert_eq!(
            egress_runtime(&named, Some("runsc")).as_deref(),
            Some("gvisor-uds")
        );
    }

    #[tokio::test]
    async fn a_jobs_socket_directory_lives_as_long_as_its_proxy() {
        let base = tempfile::tempdir().unwrap();
        let engine = engine_dir(&EgressConfig::default(), 100_000);
        assert!(engine.ends_with("range-100000"));
        let engine = base.path().join("range-1");
        let allow = Allowlist::parse(&["upstream.test".into()]).unwrap();
        let config = EgressConfig::default();
        let job = JobEgress::start(&config, &engine, "job-1", &allow, None).unwrap();
        let socket = job.dir().join(EGRESS_SOCKET);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(job.dir()), mode(&socket)), (0o755, 0o666));
        assert_eq!(
            bind(job.dir()),
            format!("{}:/run/code-runner-egress:ro", job.dir().display())
        );
        // The socket answers as the proxy: a refusal for a host not allowed.
        let mut stream = tokio::net::UnixStream::connect(&socket).await.unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        stream
            .write_all(b"CONNECT other.test:443 HTTP/1.1\r\nHost: other.test:443\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 403 "), "{answer}");
        let dir = job.dir().to_path_buf();
        let totals = job.finish().await;
        assert_eq!((totals.connections, totals.refused), (1, 1));
        assert!(!dir.exists());

        // A dropped one is removed too, and a stale engine directory goes.
        let job = JobEgress::start(&config, &engine, "job-2", &allow, None).unwrap();
        let dir = job.dir().to_path_buf();
        drop(job);
        assert!(!dir.exists());
        std::fs::create_dir_all(engine.join("job-3")).unwrap();
        clear_stale(&engine);
        assert!(!engine.exists());
    }
}
