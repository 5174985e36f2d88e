//! The chaos test: workers `kill -9`ed at random moments while
//! jobs run, new workers started in their place; at the end every job has
//! exactly one terminal status, nothing is left in Redis, Docker holds no
//! container or volume of the test, and no job ran twice at once. A batch
//! job whose worker died while it ran runs again (up to
//! `MAX_ATTEMPTS` starts): the test reports how many were retried, checks
//! each ended with its own output once, and, from Docker's event stream,
//! that no job ever had two containers alive at the same time.
//!
//! Gated: runs only when `CODE_RUNNER_CHAOS_JOBS` is set to the number of
//! jobs to submit (scripts/test sets a small count). The moments and victims
//! come from a seeded RNG; the seed is printed, and
//! `CODE_RUNNER_CHAOS_SEED=<seed>` replays the same choices (the timing of the
//! machine still varies).
//!
//! Every process is a child of the test with a worker id of its own
//! (`test-<uuid>`), killed by its pid when its guard drops, also when the
//! test fails.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use code_runner::sandbox::{LABEL_CREATED, LABEL_DEADLINE, LABEL_JOB, LABEL_WORKER};
use common::containers::{Lifetimes, docker, list_labelled};
use common::daemon::{Daemon, DaemonBuilder, KEY_A, KEY_B, Role, python};
use common::redis_server::RedisServer;
use redis::AsyncCommands;
use serde_json::Value;

/// Reaper and heartbeat settings of every worker: a dead worker is noticed
/// within about a second.
const HEARTBEAT_INTERVAL_MS: u64 = 300;
const HEARTBEAT_TTL_MS: u64 = 1000;
const REAPER_INTERVAL_MS: u64 = 300;
const REAPER_GRACE_MS: u64 = 1000;
/// Times a claimed-but-never-started job is requeued (`CODE_RUNNER_MAX_REQUEUES`).
const MAX_REQUEUES: u32 = 3;
/// Most starts of a batch job (`CODE_RUNNER_MAX_ATTEMPTS`, on the API).
const MAX_ATTEMPTS: u64 = 3;
/// Most workers alive at once.
const MAX_WORKERS: usize = 3;
/// How often job views are polled while the queue drains.
const POLL: Duration = Duration::from_millis(200);
const TERMINAL: [&str; 5] = ["succeeded", "failed", "timed_out", "cancelled", "error"];

/// SplitMix64: small, seedable, good enough to pick moments and victims.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn index(&mut self, len: usize) -> usize {
        (self.next() % len as u64) as usize
    }

    fn percent(&mut self, p: u64) -> bool {
        self.next() % 100 < p
    }
}

/// `CODE_RUNNER_CHAOS_JOBS`; `None` when unset or empty.
fn chaos_jobs() -> Option<usize> {
    let text = std::env::var("CODE_RUNNER_CHAOS_JOBS").ok()?;
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let jobs = text
        .parse::<usize>()
        .unwrap_or_else(|_| panic!("CODE_RUNNER_CHAOS_JOBS={text:?} is not a number of jobs"));
    assert!(jobs > 0, "CODE_RUNNER_CHAOS_JOBS must be at least 1");
    Some(jobs)
}

/// `CODE_RUNNER_CHAOS_SEED`, or a fresh one.
fn chaos_seed() -> u64 {
    match std::env::var("CODE_RUNNER_CHAOS_SEED") {
        Ok(text) if !text.trim().is_empty() => text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("CODE_RUNNER_CHAOS_SEED={text:?} is not a u64")),
        _ => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            Rng(nanos ^ u64::from(std::process::id()).rotate_left(32)).next()
        }
    }
}

/// A job the test submitted: it prints its token (given on stdin) once,
/// after sleeping `sleep` seconds if set.
struct Submitted {
    id: String,
    token: String,
    sleep: Option<f64>,
    /// The API key it was submitted with.
    key: &'static str,
}

fn chaos_job(token: &str, sleep: Option<f64>) -> Value {
    let source = match sleep {
        None => "import sys\nprint(sys.stdin.read().strip())\n".to_string(),
        Some(seconds) => format!(
            "import sys, time\ntoken = sys.stdin.read().strip()\ntime.sleep({seconds})\nprint(token)\n"
        ),
    };
    let mut job = python(&source);
    job["stdin"] = Value::String(format!("{token}\n"));
    job
}

/// The test's fleet: the workers alive, and every worker killed so far
/// (kept for their logs and ids until the end).
struct Fleet<'a> {
    redis: &'a RedisServer,
    conn: redis::aio::MultiplexedConnection,
    alive: Vec<Daemon>,
    killed: Vec<Daemon>,
    started: Instant,
    /// Kills, and kills of a worker that held claimed jobs.
    kills: usize,
    kills_mid_job: usize,
}

impl Fleet<'_> {
    fn t(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    async fn start_worker(&mut self, rng: &mut Rng) {
        let sandboxes = rng.range(2, 3);
        let worker = DaemonBuilder::new(Role::Worker, self.redis)
            .env("CODE_RUNNER_WORKER_MAX_SANDBOXES", sandboxes)
            .env("CODE_RUNNER_HEARTBEAT_INTERVAL_MS", HEARTBEAT_INTERVAL_MS)
            .env("CODE_RUNNER_HEARTBEAT_TTL_MS", HEARTBEAT_TTL_MS)
            .env("CODE_RUNNER_REAPER_INTERVAL_MS", REAPER_INTERVAL_MS)
            .env("CODE_RUNNER_REAPER_GRACE_MS", REAPER_GRACE_MS)
            .env("CODE_RUNNER_MAX_REQUEUES", MAX_REQUEUES)
            .start()
            .await;
        println!(
            "chaos: t={:.1}s start worker {} (max sandboxes {sandboxes})",
            self.t(),
            worker.worker_id
        );
        self.alive.push(worker);
    }

    /// Kills a random worker with SIGKILL; mostly one that holds claimed
    /// jobs, so most kills land mid-job.
    async fn kill_worker(&mut self, rng: &mut Rng) {
        let mut claimed = Vec::with_capacity(self.alive.len());
        for worker in &self.alive {
            let processing = format!("worker:{}:processing", worker.worker_id);
            claimed.push(self.conn.llen::<_, u64>(&processing).await.unwrap_or(0));
        }
        let busy: Vec<usize> = (0..claimed.len()).filter(|&i| claimed[i] > 0).collect();
        let index = if !busy.is_empty() && rng.percent(80) {
            busy[rng.index(busy.len())]
        } else {
            rng.index(self.alive.len())
        };
        let claimed = claimed[index];
        let mut victim = self.alive.swap_remove(index);
        victim.kill9().await;
        self.kills += 1;
        if claimed > 0 {
            self.kills_mid_job += 1;
        }
        println!(
            "chaos: t={:.1}s kill -9 worker {} ({claimed} claimed jobs)",
            self.t(),
            victim.worker_id
        );
        self.killed.push(victim);
    }

    fn all(&self) -> impl Iterator<Item = &Daemon> {
        self.alive.iter().chain(&self.killed)
    }

    fn ids(&self) -> BTreeSet<String> {
        self.all().map(|d| d.worker_id.clone()).collect()
    }
}

/// Names of the Docker volumes that exist now.
async fn volumes(docker: &bollard::Docker) -> BTreeSet<String> {
    docker
        .list_volumes(None::<bollard::query_parameters::ListVolumesOptions>)
        .await
        .expect("docker lists volumes")
        .volumes
        .unwrap_or_default()
        .into_iter()
        .map(|v| v.name)
        .collect()
}

/// The latest `code-runner.deadline` label of the containers of `workers`.
async fn latest_deadline_ms(docker: &bollard::Docker, workers: &BTreeSet<String>) -> Option<u64> {
    list_labelled(docker, LABEL_WORKER)
        .await
        .expect("docker lists containers")
        .into_iter()
        .filter_map(|c| {
            let labels = c.labels.unwrap_or_default();
            if !workers.contains(labels.get(LABEL_WORKER)?) {
                return None;
            }
            labels.get(LABEL_DEADLINE)?.parse::<u64>().ok()
        })
        .max()
}

/// Containers (any state) labelled with one of `workers`, described for a
/// failure message: id, worker, age, deadline and Docker's status.
async fn fleet_containers(docker: &bollard::Docker, workers: &BTreeSet<String>) -> Vec<String> {
    let now = common::unix_ms();
    let ms_ago = |labels: &std::collections::HashMap<String, String>, label: &str| {
        labels
            .get(label)
            .and_then(|v| v.parse::<u64>().ok())
            .map_or("?".to_string(), |ms| {
                let ago = (now as f64 - ms as f64) / 1000.0;
                if ago >= 0.0 {
                    format!("{ago:.1}s ago")
                } else {
                    format!("in {:.1}s", -ago)
                }
            })
    };
    list_labelled(docker, LABEL_WORKER)
        .await
        .expect("docker lists containers")
        .into_iter()
        .filter_map(|c| {
            let labels = c.labels.clone().unwrap_or_default();
            let worker = labels.get(LABEL_WORKER)?;
            workers.contains(worker).then(|| {
                format!(
                    "{} of worker {worker} (job {}, created {}, deadline {}, {})",
                    c.id.as_deref().unwrap_or("?"),
                    labels.get(LABEL_JOB).map_or("?", String::as_str),
                    ms_ago(&labels, LABEL_CREATED),
                    ms_ago(&labels, LABEL_DEADLINE),
                    c.status.as_deref().unwrap_or("?"),
                )
            })
        })
        .collect()
}

/// `GET /v1/jobs/<id>` with the job's key; `None` unless 200 (the API may
/// be slow on a loaded machine; the caller polls again).
async fn view(api: &Daemon, job: &Submitted) -> Option<Value> {
    let response = api
        .http
        .get(format!("{}/v1/jobs/{}", api.url, job.id))
        .bearer_auth(job.key)
        .send()
        .await
        .ok()?;
    if !response.status().is_success() {
        return None;
    }
    response.json().await.ok()
}

fn status(view: &Value) -> &str {
    view["status"].as_str().unwrap_or("")
}

/// The non-overlapping occurrences of `token` in `text`.
fn occurrences(text: &str, token: &str) -> usize {
    text.matches(token).count()
}

/// `job started` log lines that name `id`, across every worker's log.
fn starts_logged(logs: &[String], id: &str) -> usize {
    logs.iter()
        .flat_map(|log| log.lines())
        .filter(|line| line.contains("job started") && line.contains(id))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_killed_at_random_lose_leak_and_duplicate_nothing() {
    let Some(jobs) = chaos_jobs() else {
        println!("chaos: skipped (set CODE_RUNNER_CHAOS_JOBS=<number of jobs> to run it)");
        return;
    };
    let seed = chaos_seed();
    println!("chaos: seed={seed} jobs={jobs} (replay with CODE_RUNNER_CHAOS_SEED={seed})");
    let mut rng = Rng(seed);
    let started = Instant::now();

    let docker = docker().await;
    let volumes_before = volumes(&docker).await;
    let lifetimes = Lifetimes::record(&docker).await;
    // Dropped in reverse order: workers first, then the API, then Redis.
    let redis = RedisServer::start();
    // Every job is queued at once with one key and polled often: no key
    // limit, storage budget or request rate of its own gets in the way.
    let api = DaemonBuilder::new(Role::Api, &redis)
        .env("CODE_RUNNER_MAX_ATTEMPTS", MAX_ATTEMPTS)
        .env("CODE_RUNNER_KEY_MAX_ACTIVE", 100_000)
        .env("CODE_RUNNER_KEY_MAX_STORED_MB", 1 << 20)
        .env("CODE_RUNNER_KEY_RATE", 1_000_000)
        .env("CODE_RUNNER_KEY_BURST", 1_000_000)
        .start()
        .await;
    let mut conn = redis.conn().await;
    let mut fleet = Fleet {
        redis: &redis,
        conn: redis.conn().await,
        alive: Vec::new(),
        killed: Vec::new(),
        started,
        kills: 0,
        kills_mid_job: 0,
    };
    for _ in 0..2 {
        fleet.start_worker(&mut rng).await;
    }

    // --- chaos: submit jobs, kill and start workers at random moments ------
    let min_kills = (jobs / 5).max(3);
    let mut submitted: Vec<Submitted> = Vec::new();
    while submitted.len() < jobs || fleet.kills < min_kills {
        tokio::time::sleep(Duration::from_millis(rng.range(50, 500))).await;
        let roll = rng.range(0, 99);
        if roll < 55 && submitted.len() < jobs {
            let batch = (rng.range(1, 3) as usize).min(jobs - submitted.len());
            for _ in 0..batch {
                let token = format!("token-{}", uuid::Uuid::new_v4().simple());
                let sleep = rng.percent(40).then(|| rng.range(2, 15) as f64 / 10.0);
                // Two keys, each with three users and its anonymous one:
                // the claims take turns across all of them.
                let key = if rng.percent(50) { KEY_A } else { KEY_B };
                let mut job = chaos_job(&token, sleep);
                let user = rng.index(4);
                if user > 0 {
                    job["user"] = Value::String(format!("student-{user}"));
                }
                let answer = api.submit_as(Some(key), &job, false).await;
                assert!(answer.status.is_success(), "submit refused: {answer:#?}");
                submitted.push(Submitted {
                    id: answer.id(),
                    token,
                    sleep,
                    key,
                });
            }
        } else if roll < 85 && !fleet.alive.is_empty() {
            fleet.kill_worker(&mut rng).await;
            if fleet.alive.is_empty() || rng.percent(80) {
                fleet.start_worker(&mut rng).await;
            }
        } else if fleet.alive.len() < MAX_WORKERS {
            fleet.start_worker(&mut rng).await;
        }
    }
    if fleet.alive.is_empty() {
        fleet.start_worker(&mut rng).await;
    }
    let chaos_ended = Instant::now();
    println!(
        "chaos: t={:.1}s chaos over: {} jobs submitted ({} sleepers), {} kills ({} with claimed jobs), {} workers started; {} alive until the queue drains",
        fleet.t(),
        submitted.len(),
        submitted.iter().filter(|j| j.sleep.is_some()).count(),
        fleet.kills,
        fleet.kills_mid_job,
        fleet.alive.len() + fleet.killed.len(),
        fleet.alive.len()
    );

    // --- the queue drains: every job reaches a terminal status --------------
    // The first terminal view seen of each job: it must never change.
    let mut first_terminal: BTreeMap<String, Value> = BTreeMap::new();
    let drain_deadline = Instant::now() + Duration::from_secs(60) + POLL * jobs as u32;
    loop {
        for job in &submitted {
            if first_terminal.contains_key(&job.id) {
                continue;
            }
            if let Some(view) = view(&api, job).await
                && TERMINAL.contains(&status(&view))
            {
                first_terminal.insert(job.id.clone(), view);
            }
        }
        if first_terminal.len() == submitted.len() || Instant::now() > drain_deadline {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    println!(
        "chaos: t={:.1}s {} of {} jobs terminal ({:.1}s after the chaos)",
        fleet.t(),
        first_terminal.len(),
        submitted.len(),
        chaos_ended.elapsed().as_secs_f64()
    );

    // --- Redis settles: queue and processing lists empty, dead workers forgotten
    let live: BTreeSet<String> = fleet.alive.iter().map(|d| d.worker_id.clone()).collect();
    let settle_deadline = Instant::now() + Duration::from_secs(15);
    let redis_problems = loop {
        let mut problems = Vec::new();
        let queued: Vec<String> = conn.lrange("jobs:queue", 0, -1).await.unwrap();
        if !queued.is_empty() {
            problems.push(format!("jobs:queue holds {queued:?}"));
        }
        // The fair turns' rings and every user's queue are empty too.
        let mut waiting: Vec<String> = conn.keys("apikey:*:queue:*").await.unwrap();
        waiting.extend(conn.keys::<_, Vec<String>>("apikey:*:users").await.unwrap());
        waiting.extend(conn.keys::<_, Vec<String>>("jobs:tenants").await.unwrap());
        // Every ended job gave its user's active count back.
        waiting.extend(
            conn.keys::<_, Vec<String>>("apikey:*:user_active")
                .await
                .unwrap(),
        );
        if !waiting.is_empty() {
            problems.push(format!("fair-turn lists left: {waiting:?}"));
        }
        let lists: Vec<String> = conn.keys("worker:*:processing").await.unwrap();
        for list in lists {
            let ids: Vec<String> = conn.lrange(&list, 0, -1).await.unwrap();
            if !ids.is_empty() {
                problems.push(format!("{list} holds {ids:?}"));
            }
        }
        let members: BTreeSet<String> = conn.smembers("workers").await.unwrap();
        let unforgotten: Vec<&String> = members.difference(&live).collect();
        if !unforgotten.is_empty() {
            problems.push(format!(
                "dead workers still in the `workers` set: {unforgotten:?}"
            ));
        }
        for key in ["a", "b"] {
            let active: Vec<String> = conn.smembers(format!("apikey:{key}:active")).await.unwrap();
            if !active.is_empty() {
                problems.push(format!("apikey:{key}:active still holds {active:?}"));
            }
        }
        if problems.is_empty() || Instant::now() > settle_deadline {
            break problems;
        }
        tokio::time::sleep(POLL).await;
    };

    // --- Docker: no container of any of the test's workers, no new volume ---
    let workers = fleet.ids();
    let docker_waiting = Instant::now();
    // A worker killed while Docker was creating a container can leave one
    // the reaper could not see yet: it goes at its deadline label and the
    // reaper's grace at the latest (up to 43 s after it was created, with
    // the default limits). The wait runs to the latest such moment.
    let mut docker_deadline = docker_waiting + Duration::from_secs(20);
    let (containers_left, volumes_left) = loop {
        let containers = fleet_containers(&docker, &workers).await;
        if let Some(latest) = latest_deadline_ms(&docker, &workers).await {
            let due = Duration::from_millis(
                (latest + REAPER_GRACE_MS + 5 * REAPER_INTERVAL_MS)
                    .saturating_sub(common::unix_ms()),
            );
            docker_deadline = docker_deadline.max(Instant::now() + due);
        }
        let new_volumes: Vec<String> = volumes(&docker)
            .await
            .difference(&volumes_before)
            .cloned()
            .collect();
        if (containers.is_empty() && new_volumes.is_empty()) || Instant::now() > docker_deadline {
            break (containers, new_volumes);
        }
        tokio::time::sleep(POLL).await;
    };
    let docker_waited = docker_waiting.elapsed();

    // --- every job: one terminal status, the expected one, started once -----
    let dead_letters: BTreeSet<String> = conn
        .lrange::<_, Vec<String>>("jobs:dead", 0, -1)
        .await
        .unwrap()
        .into_iter()
        .collect();
    let logs: Vec<String> = fleet.all().map(Daemon::log).collect();
    let (mut lost, mut duplicated) = (Vec::new(), Vec::new());
    let mut unexpected = Vec::new();
    let (mut succeeded, mut worker_lost, mut dead, mut requeued) = (0, 0, 0, 0);
    let (mut retried, mut retried_succeeded) = (0, 0);
    for job in &submitted {
        let requeues: u32 = redis.job_field(&job.id, "requeues").parse().unwrap_or(0);
        if requeues > 0 {
            requeued += 1;
        }
        let Some(first) = first_terminal.get(&job.id) else {
            let now = view(&api, job).await.unwrap_or(Value::Null);
            lost.push(format!("{} has no terminal status: {now:#}", job.id));
            continue;
        };
        let last = view(&api, job).await.unwrap_or(Value::Null);
        if status(&last) != status(first) || last["result"] != first["result"] {
            unexpected.push(format!(
                "{} changed after it was terminal: first {first:#}\nthen {last:#}",
                job.id
            ));
        }
        let attempts = last["attempts"].as_u64().unwrap_or(u64::MAX);
        let stdout = last["result"]["run"]["stdout"].as_str().unwrap_or("");
        let printed = occurrences(stdout, &job.token);
        let starts = starts_logged(&logs, &job.id);
        // Each start is one attempt, up to the most; the result holds one
        // attempt's output.
        if attempts > MAX_ATTEMPTS || starts as u64 > attempts || printed >= 2 {
            duplicated.push(format!(
                "{} started more often than its attempts allow (attempts {attempts}, {starts} `job started` log lines, token printed {printed} times): {last:#}",
                job.id
            ));
            continue;
        }
        if attempts >= 2 {
            retried += 1;
        }
        let reason = last["result"]["reason"].as_str().unwrap_or("");
        let in_dead = dead_letters.contains(&job.id);
        match (status(&last), reason) {
            ("succeeded", _)
                if (1..=MAX_ATTEMPTS).contains(&attempts)
                    && stdout == format!("{}\n", job.token) =>
            {
                succeeded += 1;
                if attempts >= 2 {
                    retried_succeeded += 1;
                }
            }
            // It was running when its worker died on its last attempt.
            // (A batch job on one Docker host is retried while it has
            // attempts left: `worker_lost` before the last is a lost retry.)
            ("error", "worker_lost") if attempts == MAX_ATTEMPTS && !in_dead => {
                worker_lost += 1
            }
            // Its workers kept dying before it started: out of requeues.
            ("error", "worker_lost")
                if attempts == 0 && in_dead && requeues == MAX_REQUEUES =>
            {
                dead += 1;
            }
            _ => unexpected.push(format!(
                "{} ended unexpectedly (requeues {requeues}, in jobs:dead: {in_dead}, {starts} `job started` log lines): {last:#}",
                job.id
            )),
        }
    }

    let concurrent = lifetimes.overlaps();
    println!(
        "chaos: succeeded={succeeded} worker_lost={worker_lost} dead_lettered={dead} requeued_at_least_once={requeued} retried={retried} retried_then_succeeded={retried_succeeded} workers={} kills={} elapsed={:.1}s",
        workers.len(),
        fleet.kills,
        started.elapsed().as_secs_f64()
    );
    let leaked = containers_left.len() + volumes_left.len();
    println!(
        "jobs={} lost={} leaked={leaked} duplicated={} retried={retried} run_twice_concurrently={}",
        submitted.len(),
        lost.len(),
        duplicated.len(),
        concurrent.len()
    );
    assert!(
        concurrent.is_empty(),
        "seed {seed}: jobs ran in two sandboxes at once:\n{}",
        concurrent.join("\n")
    );
    assert!(
        lost.is_empty(),
        "seed {seed}: lost jobs:\n{}",
        lost.join("\n")
    );
    assert!(
        duplicated.is_empty(),
        "seed {seed}: jobs started twice:\n{}",
        duplicated.join("\n")
    );
    if !containers_left.is_empty() {
        let members: BTreeSet<String> = conn.smembers("workers").await.unwrap();
        panic!(
            "seed {seed}: containers left behind {:.0}s after the queue drained (the `workers` set is now {members:?}):\n{}",
            docker_waited.as_secs_f64(),
            containers_left.join("\n")
        );
    }
    assert!(
        volumes_left.is_empty(),
        "seed {seed}: volumes left behind: {volumes_left:?}"
    );
    assert!(
        unexpected.is_empty(),
        "seed {seed}: jobs with an unexpected end:\n{}",
        unexpected.join("\n")
    );
    assert!(
        redis_problems.is_empty(),
        "seed {seed}: redis did not settle:\n{}",
        redis_problems.join("\n")
    );
}
