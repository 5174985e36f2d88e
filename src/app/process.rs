//! A process's life once its [`Plan`] is validated: binds its listener,
//! connects to Docker, starts the reaper and the worker, serves HTTP (the
//! API, or the worker's and the reaper's own /healthz, /readyz and
//! /metrics) until SIGTERM or SIGINT, then drains and returns the exit code.
//! An API waits for a Redis that does not answer yet before it serves: its
//! attach tokens' secret is derived from a salt kept there. The root
//! cancellation token and the task tracker are this file's; the HTTP server
//! outlives the drain until the worker has finished (clients can still read
//! their results; submissions get 503).
//!
//! Under systemd (`Type=notify`, see `scripts/install`) it tells the service
//! manager `READY=1` once every role of the process is up (listener bound,
//! Docker and Redis clients built, worker and reaper started) and
//! `STOPPING=1` when a signal starts the drain. Without `NOTIFY_SOCKET` in the
//! environment both are no-ops.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::plan::{ApiPlan, Plan};
use crate::api::{ApiConfig, ApiState, TokenSigner};
use crate::exit;
use crate::job::carry::CarriedJobs;
use crate::job::limits::LimitPolicy;
use crate::languages::LanguageCatalog;
use crate::metrics::Metrics;
use crate::reaper::{Reaper, ReaperConfig, ReaperHandles};
use crate::sandbox::{DockerEngine, Engine};
use crate::store::Store;
use crate::worker::backoff::{Backoff, sleep_unless_cancelled};
use crate::worker::{Services, Worker, WorkerConfig};

impl Plan {
    /// Runs the plan until SIGTERM or SIGINT has drained it; returns the
    /// exit code.
    pub async fn run(self) -> u8 {
        raise_open_files_limit();
        let listener = match TcpListener::bind(self.listen).await {
            Ok(listener) => listener,
            Err(error) => {
                eprintln!("code-runner: cannot listen on {}: {error}", self.listen);
                return exit::UNAVAILABLE;
            }
        };
        // Only a worker and a reaper work with Docker.
        let engine = if self.worker.is_some() || self.reaper.is_some() {
            match DockerEngine::connect(self.setup.sandbox.clone()).await {
                Ok(engine) => Some(Arc::new(engine) as Engine),
                Err(error) => {
                    eprintln!("code-runner: {error}");
                    return exit::UNAVAILABLE;
                }
            }
        } else {
            None
        };
        let signals = CancellationToken::new();
        tokio::spawn(shutdown_on_signal(signals.clone()));
        self.run_on(listener, engine, signals).await
    }

    /// Runs the plan's roles on `listener` with `engine` (a worker's and a
    /// reaper's; `None` when the plan has neither) until `stop` is
    /// cancelled and the drain is over; returns the exit code. [`Plan::run`]
    /// binds, connects to Docker and stops on SIGTERM or SIGINT; a test
    /// runs a whole process in its own with a scripted engine.
    pub async fn run_on(
        self,
        listener: TcpListener,
        engine: Option<Engine>,
        stop: CancellationToken,
    ) -> u8 {
        let metrics = match Metrics::new() {
            Ok(metrics) => metrics,
            Err(error) => {
                eprintln!("code-runner: cannot set up metrics: {error}");
                return exit::PLATFORM_ERROR;
            }
        };
        let ready_status = format!(
            "{} listening on {}",
            self.role_names().join(" + "),
            self.listen
        );
        let Plan {
            setup,
            store,
            api,
            worker,
            reaper,
            ..
        } = self;
        // A worker offers the languages whose images its Docker has (read
        // once, at start: restart it after building more); `serve`'s API
        // offers the same, an `api` process what its live workers advertise.
        let offered = match (&engine, &worker) {
            (Some(engine), Some(_)) => installed_catalog(engine, &setup.catalog).await,
            _ => setup.catalog,
        };
        let process = Process {
            store,
            metrics,
            offered,
            policy: setup.policy,
            engine,
            // In `serve`, the API hands the jobs it prepared to its own worker.
            carried: (api.is_some() && worker.is_some()).then(CarriedJobs::default),
            root: CancellationToken::new(),
            tracker: TaskTracker::new(),
        };
        {
            let root = process.root.clone();
            process.tracker.spawn(async move {
                tokio::select! {
                    () = stop.cancelled() => root.cancel(),
                    () = root.cancelled() => {}
                }
            });
        }
        process
            .serve(listener, api, worker, reaper, &ready_status)
            .await
    }
}

/// How often an API process deletes the objects of files that went.
const FILE_COLLECT_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// What the roles of a running process share, and the root cancellation
/// token and task tracker that stop them.
struct Process {
    store: Store,
    metrics: Metrics,
    /// The languages this process offers.
    offered: LanguageCatalog,
    policy: LimitPolicy,
    /// Set when the process runs a worker or a reaper.
    engine: Option<Engine>,
    /// Set in `serve`: the jobs the API prepared for the worker beside it.
    carried: Option<CarriedJobs>,
    /// Cancelled by SIGTERM/SIGINT: the drain begins.
    root: CancellationToken,
    tracker: TaskTracker,
}

impl Process {
    /// Starts the roles, serves HTTP until the drain is over (or the server
    /// failed), stops everything; returns the exit code.
    async fn serve(
        self,
        listener: TcpListener,
        api: Option<ApiPlan>,
        worker: Option<WorkerConfig>,
        reaper: Option<ReaperConfig>,
        ready_status: &str,
    ) -> u8 {
        if let Some(config) = reaper {
            self.start_reaper(config);
        }
        let is_worker = worker.is_some();
        let worker_task = worker.and_then(|config| self.start_worker(config));
        let http_stop = self.stop_http_after_drain(worker_task);
        let served = match api {
            Some(api) => {
                self.start_file_collector();
                let state = match self.api_state(api).await {
                    Ok(state) => state,
                    Err(code) => return self.stop(code).await,
                };
                notify_ready(ready_status);
                crate::api::serve(listener, state, http_stop).await
            }
            None => {
                notify_ready(ready_status);
                // A worker's /readyz checks Docker and its images, a
                // reaper's Docker alone.
                let offered = is_worker.then_some(&self.offered);
                crate::api::serve_ops(
                    listener,
                    self.metrics.clone(),
                    self.store.clone(),
                    self.engine.clone(),
                    offered,
                    http_stop,
                )
                .await
            }
        };
        // The server returns once the worker (if any) has drained, or when
        // its listener failed: then everything stops and the process exits
        // non-zero, so a supervisor restarts it.
        let code = match served {
            Ok(()) => 0,
            Err(error) => {
                eprintln!("code-runner: the HTTP server failed: {error}");
                tracing::error!(%error, "the HTTP server failed; shutting down");
                exit::UNAVAILABLE
            }
        };
        self.stop(code).await
    }

    /// With files' bytes apart from their metadata (the S3 backend), deletes
    /// the bytes of files that went, every second, in each API process: the
    /// metadata's expiry cannot reach the bucket (`store::files::s3`).
    fn start_file_collector(&self) {
        if self.store.files().backend() == "redis" {
            return;
        }
        let files = self.store.files().clone();
        let stop = self.root.clone();
        self.tracker.spawn(async move {
            let mut tick = tokio::time::interval(FILE_COLLECT_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                match files.collect_garbage().await {
                    Ok(0) => {}
                    Ok(deleted) => tracing::debug!(deleted, "deleted the objects of files that went"),
                    Err(error) => tracing::warn!(%error, "cannot delete the objects of files that went; trying again"),
                }
            }
        });
    }

    /// Stops every task and waits for them; returns `code`.
    async fn stop(self, code: u8) -> u8 {
        self.root.cancel();
        self.tracker.close();
        self.tracker.wait().await;
        code
    }

    fn start_reaper(&self, config: ReaperConfig) {
        let Some(engine) = self.engine.clone() else {
            return;
        };
        // No drain: a pass in flight is dropped at shutdown; every step of
        // it is atomic on its own, and the next reaper picks up the rest.
        let handles = ReaperHandles {
            store: self.store.clone(),
            engine,
            catalog: self.offered.clone(),
            metrics: self.metrics.clone(),
            longest_wall: self.policy.longest_wall(),
        };
        let reaper = Reaper::new(config, handles);
        let shutdown = self.root.child_token();
        self.tracker
            .spawn(async move { reaper.run(shutdown).await });
    }

    fn start_worker(&self, config: WorkerConfig) -> Option<JoinHandle<()>> {
        let services = Services {
            store: self.store.clone(),
            engine: self.engine.clone()?,
            catalog: self.offered.clone(),
            policy: self.policy.clone(),
            metrics: self.metrics.clone(),
            carried: self.carried.clone(),
        };
        let worker = Worker::new(config, services);
        let shutdown = self.root.child_token();
        Some(
            self.tracker
                .spawn(async move { worker.run(shutdown).await }),
        )
    }

    /// The token that stops the HTTP server: once the drain has begun and
    /// the worker (if any) has finished. The server outlives the drain:
    /// while the worker finishes its jobs, clients can still read their
    /// results (submissions get 503).
    fn stop_http_after_drain(&self, worker_task: Option<JoinHandle<()>>) -> CancellationToken {
        let http_stop = CancellationToken::new();
        let (root, stop) = (self.root.clone(), http_stop.clone());
        self.tracker.spawn(async move {
            root.cancelled().await;
            if let Some(worker_task) = worker_task {
                let _ = worker_task.await;
            }
            stop.cancel();
        });
        http_stop
    }

    /// The API's state, once its attach tokens' signer is set up; `Err` is
    /// the exit code when it cannot be.
    async fn api_state(&self, api: ApiPlan) -> Result<ApiState, u8> {
        let tokens = self.token_signer(&api).await?;
        let state = ApiState::new(ApiConfig {
            store: self.store.clone(),
            catalog: self.offered.clone(),
            policy: self.policy.clone(),
            keys: api.keys,
            metrics: self.metrics.clone(),
            max_queue_depth: api.max_queue_depth,
            max_body_bytes: api.max_body_bytes,
            max_wait: api.max_wait,
            tokens,
            draining: self.root.clone(),
            engine: self.engine.clone(),
            carried: self.carried.clone(),
            limits: api.limits,
        })
        .with_compat(api.compat)
        .with_web_ui(api.web);
        Ok(state)
    }

    /// The attach tokens' signer. Its secret is derived from a salt kept in
    /// Redis: a Redis that refuses connections (not started yet, or
    /// restarting) is waited for, as the worker and the reaper wait for it;
    /// any other failure is exit 69, a signal while waiting exit 0.
    async fn token_signer(&self, api: &ApiPlan) -> Result<TokenSigner, u8> {
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
        let mut warned = false;
        loop {
            let signer = TokenSigner::from_config(
                api.token_secret.as_deref(),
                &api.keys,
                &self.store,
                api.token_ttl,
            )
            .await;
            match signer {
                Ok(tokens) => {
                    if warned {
                        tracing::info!("Redis answers; the API starts");
                    }
                    return Ok(tokens);
                }
                Err(error) if !error.is_unreachable() => {
                    // TLS, authentication, a non-Redis peer: waiting does
                    // not mend these.
                    eprintln!("code-runner: cannot set up attach tokens: {error}");
                    return Err(exit::UNAVAILABLE);
                }
                Err(error) => {
                    if !warned {
                        tracing::warn!(%error, "Redis does not answer; the API waits for it before it serves (the attach tokens' salt is kept there)");
                        warned = true;
                    }
                    if !sleep_unless_cancelled(backoff.next_delay(), &self.root).await {
                        return Err(0);
                    }
                }
            }
        }
    }
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
pub async fn installed_catalog(engine: &Engine, catalog: &LanguageCatalog) -> LanguageCatalog {
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

/// Tells systemd that every role of the process is up, with `status`.
fn notify_ready(status: &str) {
    notify_service_manager(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(status),
    ]);
}

/// Tells systemd (when it started this process with `Type=notify`) about a
/// state change. Not being under systemd is the common case and no error; a
/// failed send is logged, never fatal: the process works the same without it.
fn notify_service_manager(states: &[sd_notify::NotifyState<'_>]) {
    if let Err(error) = sd_notify::notify(states) {
        tracing::warn!(error = %error, "cannot notify the service manager (NOTIFY_SOCKET)");
    }
}
