//! `code-runner doctor`: checks what a worker needs and says what is wrong,
//! one line per problem (and one `ok` line per check that passed). The
//! Redis in use is looked at too: one that would lose jobs (no persistence,
//! an evicting policy) or does not answer gets a `warning` line; warnings
//! do not change the exit code (a worker may start before its Redis).

use std::path::PathBuf;

use sha2::{Digest, Sha256};

use crate::config::{RedisSettings, SandboxSettings};
use crate::exit;
use crate::protocol::PROTOCOL_VERSION;
use crate::sandbox::DockerEngine;

struct Report {
    problems: usize,
}

impl Report {
    fn ok(&self, message: impl std::fmt::Display) {
        println!("ok: {message}");
    }
    fn problem(&mut self, message: impl std::fmt::Display) {
        self.problems += 1;
        println!("problem: {message}");
    }
    fn warning(&self, message: impl std::fmt::Display) {
        println!("warning: {message}");
    }
}

/// What the Redis in use keeps and evicts.
async fn check_redis(report: &mut Report, settings: &RedisSettings) {
    let store = match settings.build() {
        Ok(store) => store,
        Err(error) => {
            report.problem(error);
            return;
        }
    };
    let url = redact(&settings.redis_url);
    let health =
        tokio::time::timeout(std::time::Duration::from_secs(5), store.redis_health()).await;
    match health {
        Ok(Ok(health)) => {
            report.ok(format!("redis at {url} answers"));
            let warnings = health.warnings();
            for warning in &warnings {
                report.warning(warning);
            }
            if warnings.is_empty() {
                report.ok("redis keeps an append-only file and never evicts keys");
            }
            if health.maxmemory == 0 {
                println!(
                    "note: redis has no maxmemory: it grows until the machine runs out; set one (see docs/operations.md)"
                );
            }
        }
        Ok(Err(error)) => report.warning(format!("redis at {url} does not answer: {error}")),
        Err(_) => report.warning(format!("redis at {url} does not answer within 5 s")),
    }
}

/// A Redis URL without its password.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://…@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_string(),
    }
}

/// The supervisor binary built beside this one, if there is one: images
/// built with another supervisor are stale.
fn local_init_binary() -> Option<PathBuf> {
    // The images carry the static build (target/<triple>/release), not the
    // ordinary one beside this binary (target/release).
    let exe = std::env::current_exe().ok()?;
    let target = exe.parent()?.parent()?;
    let triple = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
    Some(target.join(&triple).join("release/code-runner-init")).filter(|p| p.is_file())
}

fn sha256_file(path: &PathBuf) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    Some(hex::encode(Sha256::digest(&bytes)))
}

pub async fn run(settings: &SandboxSettings, redis: &RedisSettings) -> u8 {
    let mut report = Report { problems: 0 };
    let setup = match settings.build("doctor") {
        Ok(setup) => setup,
        Err(error) => {
            report.problem(&error);
            return exit::USAGE;
        }
    };
    report.ok(format!(
        "seccomp profile is valid ({} bytes)",
        setup.sandbox.seccomp.security_opt().len() - "seccomp=".len()
    ));
    report.ok(format!(
        "language catalog has {} languages",
        setup.catalog.all().len()
    ));

    let runtime = setup.sandbox.runtime.clone();
    let engine = match DockerEngine::connect(setup.sandbox).await {
        Ok(engine) => engine,
        Err(error) => {
            report.problem(format!(
                "{error} (is dockerd running? scripts/up starts it)"
            ));
            return exit::UNAVAILABLE;
        }
    };
    let docker = engine.docker();
    match docker.info().await {
        Ok(info) => {
            report.ok(format!(
                "docker {} reachable",
                info.server_version.unwrap_or_default()
            ));
            let runtimes: Vec<String> = info
                .runtimes
                .map(|r| r.into_keys().collect())
                .unwrap_or_default();
            let wanted = runtime.unwrap_or_else(|| "runc".into());
            if runtimes.contains(&wanted) {
                report.ok(format!("sandbox runtime {wanted} is registered"));
            } else {
                report.problem(format!(
                    "sandbox runtime {wanted} is not registered with docker (has: {})",
                    runtimes.join(", ")
                ));
            }
            if wanted != "runsc" && !runtimes.iter().any(|r| r == "runsc") {
                println!(
                    "note: gVisor (runsc) is not registered; SANDBOX_RUNTIME=runsc will not work"
                );
            }
        }
        Err(error) => report.problem(format!("docker info failed: {error}")),
    }

    check_redis(&mut report, redis).await;

    // Only the languages whose images are built are offered (an operator
    // builds the ones they want): a missing image is a note, not a problem.
    let init_sha = local_init_binary().and_then(|p| sha256_file(&p));
    let mut installed = Vec::new();
    let mut absent = Vec::new();
    for language in setup.catalog.all() {
        let image = language.image_ref();
        match docker.inspect_image(&image).await {
            Err(_) => absent.push(language.id.as_str()),
            Ok(inspect) => {
                installed.push(language.id.as_str());
                let labels = inspect.config.and_then(|c| c.labels).unwrap_or_default();
                let protocol = labels
                    .get("code-runner.protocol")
                    .cloned()
                    .unwrap_or_default();
                if protocol != PROTOCOL_VERSION.to_string() {
                    report.problem(format!(
                        "image {image} speaks supervisor protocol {protocol:?}, not {PROTOCOL_VERSION}; run scripts/build-images {}",
                        language.id
                    ));
                } else if let (Some(want), Some(have)) =
                    (&init_sha, labels.get("code-runner.init-sha256"))
                    && want != have
                {
                    report.problem(format!(
                        "image {image} carries an older code-runner-init; run scripts/build-images {}",
                        language.id
                    ));
                } else {
                    report.ok(format!("image {image} is present and current"));
                }
            }
        }
    }
    if installed.is_empty() {
        report.problem("no language image is built; run scripts/build-images");
    } else {
        report.ok(format!(
            "{} languages installed: {}",
            installed.len(),
            installed.join(", ")
        ));
    }
    if !absent.is_empty() {
        println!(
            "note: {} languages of the catalog are not installed (no image): {}; scripts/build-images {} builds them",
            absent.len(),
            absent.join(", "),
            absent.join(" ")
        );
    }
    if report.problems == 0 {
        0
    } else {
        println!("{} problem(s) found", report.problems);
        1
    }
}
