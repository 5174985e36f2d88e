//! Wires the roles of the daemon (`serve`, `api`, `worker`, `reaper`) together
//! (every process with a worker runs the reaper too): validates
//! every setting before anything binds or connects, owns the root
//! cancellation token and the task tracker, and turns SIGTERM/SIGINT into a
//! graceful shutdown (the worker drains; the API stops accepting).
//!
//! Under systemd (`Type=notify`, see `scripts/install`) it tells the service
//! manager `READY=1` once every role of the process is up (listener bound,
//! Docker and Redis clients built, worker and reaper started) and
//! `STOPPING=1` when a signal starts the drain. Without `NOTIFY_SOCKET` in the
//! environment both are no-ops.

use std::collections::HashSet;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api::{ApiConfig, ApiKeys, ApiState, TokenSigner};
use crate::config::{
    ApiSettings, ConfigError, ReaperSettings, RedisSettings, SandboxSettings, WorkerSettings,
};
use crate::exit;
use crate::job::carry::CarriedJobs;
use crate::languages::LanguageCatalog;
use crate::metrics::Metrics;
use crate::reaper::{Reaper, ReaperHandles};
use crate::sandbox::{SandboxConfig, SandboxEngine};
use crate::worker::backoff::{Backoff, sleep_unless_cancelled};
use crate::worker::{Services, Worker, WorkerConfig};

fn config_error(error: ConfigError) -> u8 {
    eprintln!("code-runner: {error}");
    exit::USAGE
}

/// Runs the given roles until SIGTERM or SIGINT; returns the exit code. The
/// reaper runs when its settings are given (every role with a worker, and
/// the `reaper` role alone).
pub async fn run(
    sandbox: &SandboxSettings,
    redis: &RedisSettings,
    worker: Option<&WorkerSettings>,
    api: Option<&ApiSettings>,
    reaper: Option<&ReaperSettings>,
) -> u8 {
    // 1. Validate everything; nothing has connected or bound yet. Every
    // role with a worker has the reaper's settings (the heartbeat TTL).
    let heartbeat_ttl_ms = reaper.map_or(15_000, |r| r.heartbeat_ttl_ms);
    let worker_id = match worker.map(|w| w.validate(heartbeat_ttl_ms)).transpose() {
        Ok(id) => id,
        Err(error) => return config_error(error),
    };
    let reaper_config = match reaper
        .map(|r| ReaperSettings::validate(r, worker_id.clone()))
        .transpose()
    {
        Ok(config) => config,
        Err(error) => return config_error(error),
    };
    let api_limits = match api.map(ApiSettings::limits).transpose() {
        Ok(limits) => limits.unwrap_or_default(),
        Err(error) => return config_error(error),
    };
    let max_requeues = reaper.map_or(3, |r| r.max_requeues);
    let default_id = if reaper.is_some() { "reaper" } else { "api" };
    let setup = match sandbox.build(worker_id.as_deref().unwrap_or(default_id)) {
        Ok(setup) => setup,
        Err(error) => return config_error(error),
    };
    let store = match redis.build() {
        Ok(store) => store,
        Err(error) => return config_error(error),
    };
    let warm_floors = match worker.map(|w| w.warm_floors(&setup.catalog)).transpose() {
        Ok(floors) => floors.unwrap_or_default(),
        Err(error) => return config_error(error),
    };
    let warm_memory_reserve = match worker.map(WorkerSettings::warm_memory_reserve).transpose() {
        Ok(reserve) => reserve.unwrap_or_default(),
        Err(error) => return config_error(error),
    };
    let warm_runtimes = match worker.map(WorkerSettings::warm_runtimes).transpose() {
        Ok(on) => on.unwrap_or_default(),
        Err(error) => return config_error(error),
    };
    let yield_while_busy = match worker.map(WorkerSettings::yield_while_busy).transpose() {
        Ok(on) => on.unwrap_or_default(),
        Err(error) => return config_error(error),
    };
    let token_secret = match api.map(ApiSettings::token_secret).transpose() {
        Ok(secret) => secret.flatten(),
        Err(error) => return config_error(error),
    };
    let keys = match api.map(|a| ApiKeys::parse(a.api_keys.as_deref().unwrap_or(""))) {
        Some(Err(message)) => {
            return config_error(ConfigError {
                setting: "CODE_RUNNER_API_KEYS",
                message,
            });
        }
        Some(Ok(keys)) => Some(keys),
        None => None,
    };
    let keys = match (keys, api.and_then(|a| a.key_egress.as_deref())) {
        (Some(keys), Some(egress)) => match keys.with_egress(egress) {
            Ok(keys) => Some(keys),
            Err(message) => {
                return config_error(ConfigError {
                    setting: "CODE_RUNNER_KEY_EGRESS",
                    message,
                });
            }
        },
        (keys, _) => keys,
    };
    let web = match (api, &keys) {
        (Some(api), Some(keys)) => {
            match api.web.build(api.api_keys.as_deref().unwrap_or(""), keys) {
                Ok(web) => Some(web),
                Err(error) => return config_error(error),
            }
        }
        _ => None,
    };
    let compat = match (api, &keys) {
        (Some(api), Some(keys)) => match api.compat.validate(keys.names()) {
            Ok(compat) => Some(compat),
            Err(error) => return config_error(error),
        },
        _ => None,
    };
    raise_open_files_limit();
    let metrics = match Metrics::new() {
        Ok(metrics) => metrics,
        Err(error) => {
            eprintln!("code-runner: cannot set up metrics: {error}");
            return exit::PLATFORM_ERROR;
        }
    };

    // 2. Bind, then connect.
    let listen = match (api, worker, reaper) {
        (Some(api), _, _) => api.listen,
        (None, Some(worker), _) => worker.worker_listen,
        (None, None, Some(reaper)) => reaper.reaper_listen,
        (None, None, None) => return exit::USAGE,
    };
    let listener = match tokio::net::TcpListener::bind(listen).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("code-runner: cannot listen on {listen}: {error}");
            return exit::UNAVAILABLE;
        }
    };
    let engine = match (worker, reaper) {
        (Some(_), _) | (_, Some(_)) => match SandboxEngine::connect(SandboxConfig {
            // Yielding on: a finished job's container lingers for the
            // removal queue (see `worker::removals`).
            linger: if yield_while_busy {
                crate::worker::LINGER
            } else {
                Duration::ZERO
            },
            ..setup.sandbox.clone()
        })
        .await
        {
            Ok(engine) => Some(engine),
            Err(error) => {
                eprintln!("code-runner: {error}");
                return exit::UNAVAILABLE;
            }
        },
        (None, None) => None,
    };

    // In `serve`, the API hands the jobs it prepared to its own worker.
    let carried = (api.is_some() && worker.is_some()).then(CarriedJobs::default);
    // A worker offers the languages whose images its Docker has (read once,
    // at start: restart it after building more); `serve`'s API offers the
    // same, an `api` process what its live workers advertise.
    let offered = match (&engine, worker) {
        (Some(engine), Some(_)) => installed_catalog(engine, &setup.catalog).await,
        _ => setup.catalog.clone(),
    };
    let services = |engine| Services {
        store: store.clone(),
        engine,
        catalog: offered.clone(),
        policy: setup.policy.clone(),
        metrics: metrics.clone(),
        carried: carried.clone(),
    };
    let root = CancellationToken::new();
    let tracker = TaskTracker::new();
    tracker.spawn(shutdown_on_signal(root.clone()));

    if let (Some(config), Some(engine)) = (reaper_config, engine.clone()) {
        // No drain: a pass in flight is dropped at shutdown; every step of
        // it is atomic on its own, and the next reaper picks up the rest.
        let handles = ReaperHandles {
            store: store.clone(),
            engine,
            catalog: offered.clone(),
            metrics: metrics.clone(),
            longest_wall: setup.policy.longest_wall(),
        };
        let reaper = Reaper::new(config, handles);
        let shutdown = root.child_token();
        tracker.spawn(async move { reaper.run(shutdown).await });
    }

    let mut worker_task = None;
    if let (Some(settings), Some(worker_id), Some(engine)) = (worker, worker_id, engine.clone()) {
        let config = WorkerConfig {
            id: worker_id,
            max_sandboxes: settings.worker_max_sandboxes,
            heartbeat_interval: Duration::from_millis(settings.heartbeat_interval_ms),
            heartbeat_ttl: Duration::from_millis(heartbeat_ttl_ms),
            drain_timeout: Duration::from_millis(settings.drain_timeout_ms),
            warm_floors,
            warm_max: settings.warm_max,
            warm_lifetime: Duration::from_secs(settings.warm_lifetime_secs),
            warm_runtimes,
            yield_while_busy,
            refill_hold: crate::worker::REFILL_HOLD,
            warm_memory_reserve,
            max_requeues,
        };
        let worker = Worker::new(config, services(engine));
        let shutdown = root.child_token();
        worker_task = Some(tracker.spawn(async move { worker.run(shutdown).await }));
    }
    // The HTTP server outlives the drain: while the worker finishes its jobs,
    // clients can still read their results (submissions get 503).
    let http_stop = CancellationToken::new();
    {
        let (root, http_stop) = (root.clone(), http_stop.clone());
        tracker.spawn(async move {
            root.cancelled().await;
            if let Some(worker_task) = worker_task {
                let _ = worker_task.await;
            }
            http_stop.cancel();
        });
    }

    let roles: Vec<&str> = [
        api.map(|_| "api"),
        worker.map(|_| "worker"),
        reaper.map(|_| "reaper"),
    ]
    .into_iter()
    .flatten()
    .collect();
    let ready_status = format!("{} listening on {listen}", roles.join(" + "));
    let served = match (api, keys) {
        (Some(settings), Some(keys)) => {
            // The attach tokens' secret is derived from a salt kept in Redis:
            // a Redis that refuses connections (not started yet, or
            // restarting) is waited for, as the worker and the reaper wait
            // for it; any other failure ends the process.
            let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
            let mut warned = false;
            let tokens = loop {
                match TokenSigner::from_config(
                    token_secret,
                    &keys,
                    &store,
                    Duration::from_secs(settings.token_ttl_secs),
                )
                .await
                {
                    Ok(tokens) => break tokens,
                    Err(error) if !error.is_unreachable() => {
                        // TLS, authentication, a non-Redis peer: waiting
                        // does not mend these.
                        eprintln!("code-runner: cannot set up attach tokens: {error}");
                        root.cancel();
                        tracker.close();
                        tracker.wait().await;
                        return exit::UNAVAILABLE;
                    }
                    Err(error) => {
                        if !warned {
                            tracing::warn!(%error, "Redis does not answer; the API waits for it before it serves (the attach tokens' salt is kept there)");
                            warned = true;
                        }
                        if !sleep_unless_cancelled(backoff.next_delay(), &root).await {
                            tracker.close();
                            tracker.wait().await;
                            return 0;
                        }
                    }
                }
            };
            if warned {
                tracing::info!("Redis answers; the API starts");
            }
            let state = ApiState::new(ApiConfig {
                store: store.clone(),
                catalog: offered.clone(),
                policy: setup.policy.clone(),
                keys,
                metrics: metrics.clone(),
                max_queue_depth: settings.max_queue_depth,
                max_body_bytes: settings.max_body_bytes,
                max_wait: Duration::from_millis(settings.max_wait_ms),
                tokens,
                draining: root.clone(),
                engine,
                carried,
                limits: api_limits,
            })
            .with_compat(compat.unwrap_or_default());
            let state = match web {
                Some(web) => state.with_web_ui(web),
                None => state,
            };
            notify_service_manager(&[
                sd_notify::NotifyState::Ready,
                sd_notify::NotifyState::Status(&ready_status),
            ]);
            crate::api::serve(listener, state, http_stop.clone()).await
        }
        _ => {
            notify_service_manager(&[
                sd_notify::NotifyState::Ready,
                sd_notify::NotifyState::Status(&ready_status),
            ]);
            // A worker's /readyz checks Docker and its images, a reaper's
            // Docker alone.
            let offered = worker.is_some().then_some(&offered);
            crate::api::serve_ops(listener, metrics, store, engine, offered, http_stop.clone())
                .await
        }
    };
    // The server returns once the worker (if any) has drained, or when its
    // listener failed: then everything stops and the process exits
    // non-zero, so a supervisor restarts it.
    let code = match served {
        Ok(()) => 0,
        Err(error) => {
            eprintln!("code-runner: the HTTP server failed: {error}");
            tracing::error!(%error, "the HTTP server failed; shutting down");
            exit::UNAVAILABLE
        }
    };
    root.cancel();
    tracker.close();
    tracker.wait().await;
    code
}

/// Raises the soft limit of open files to the hard limit: every stream
/// client, Redis connection and Docker call takes a descriptor, and the
/// default soft limit (often 1024) is far below what the stream caps
/// allow.
fn raise_open_files_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => {
            if let Err(error) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                tracing::warn!(%error, soft, hard, "cannot raise the open files limit");
            }
        }
        Ok(_) => {}
        Err(error) => tracing::warn!(%error, "cannot read the open files limit"),
    }
}

/// How long looking up the catalog's images may take at start.
const IMAGE_CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// The languages of `catalog` whose image this Docker host has. When Docker
/// cannot be asked, the whole catalog (a job then fails with a clear error
/// if its image is missing).
pub async fn installed_catalog(
    engine: &SandboxEngine,
    catalog: &LanguageCatalog,
) -> LanguageCatalog {
    let images: Vec<String> = catalog.all().iter().map(|l| l.image_ref()).collect();
    let failing = engine.readiness(&images, IMAGE_CHECK_TIMEOUT).await;
    if let Some((_, message)) = failing.iter().find(|(check, _)| check == "docker") {
        tracing::warn!(error = %message, "cannot list the runner images; offering every language of the catalog");
        return catalog.clone();
    }
    let missing: HashSet<&str> = failing
        .iter()
        .filter_map(|(check, _)| check.strip_prefix("image "))
        .collect();
    let installed = catalog.only(|l| !missing.contains(l.image_ref().as_str()));
    let absent: Vec<&str> = catalog
        .all()
        .iter()
        .filter(|l| missing.contains(l.image_ref().as_str()))
        .map(|l| l.id.as_str())
        .collect();
    if installed.all().is_empty() {
        tracing::error!("no runner image is built: every job will fail; run scripts/build-images");
    } else {
        tracing::info!(languages = %installed.ids().join(","), "the worker offers these languages");
    }
    if !absent.is_empty() {
        tracing::info!(
            languages = %absent.join(","),
            "languages not offered (no image; scripts/build-images LANG builds one)"
        );
    }
    installed
}

async fn shutdown_on_signal(root: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop with SIGKILL");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received; shutting down"),
        _ = int.recv() => tracing::info!("SIGINT received; shutting down"),
        () = root.cancelled() => return,
    }
    notify_service_manager(&[
        sd_notify::NotifyState::Stopping,
        sd_notify::NotifyState::Status("draining: no new jobs, running jobs finish"),
    ]);
    root.cancel();
}

/// Tells systemd (when it started this process with `Type=notify`) about a
/// state change. Not being under systemd is the common case and no error; a
/// failed send is logged, never fatal: the process works the same without it.
fn notify_service_manager(states: &[sd_notify::NotifyState<'_>]) {
    if let Err(error) = sd_notify::notify(states) {
        tracing::warn!(error = %error, "cannot notify the service manager (NOTIFY_SOCKET)");
    }
}
