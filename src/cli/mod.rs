//! The command line: one binary, several roles and tools. Every flag of a
//! role is also read from a `CODE_RUNNER_*` environment variable; a bad
//! value exits 64 with one line naming the variable (see [`crate::config`]).

mod doctor;
mod sandbox_run;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::app::Roles;
use crate::config::{ApiSettings, ReaperSettings, RedisSettings, SandboxSettings, WorkerSettings};
use crate::exit;

#[derive(Debug, Parser)]
#[command(
    name = "code-runner",
    version,
    about = "Runs untrusted code in hardened per-job containers"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run jobs directly through the sandbox engine (no Redis, no API).
    #[command(subcommand)]
    Sandbox(SandboxCommand),
    /// List the languages this server offers.
    Languages(Box<LanguagesArgs>),
    /// Check Docker, runtimes, images and the seccomp profile; one line per problem.
    Doctor(Box<DoctorArgs>),
    /// API + worker + reaper in one process (the single-machine default).
    Serve(Box<ServeArgs>),
    /// The HTTP API only.
    Api(Box<ApiArgs>),
    /// A worker only: claims jobs from Redis and runs them (a fleet node);
    /// it runs the reaper too.
    Worker(Box<WorkerArgs>),
    /// The orphan reaper only: removes the containers and reaps the jobs
    /// of workers that died.
    Reaper(Box<ReaperArgs>),
    /// Submit files to a running API, print the output, exit with the
    /// program's exit code.
    Run(Box<crate::client::RunArgs>),
    /// The fleet's warm capacity schedule (pre-warming for a known burst);
    /// needs an API key with the admin scope.
    Capacity(Box<crate::client::capacity::CapacityArgs>),
    /// A key's usage per UTC day and per user (jobs, CPU, wall time,
    /// output), from a running API.
    Usage(Box<crate::client::usage::UsageArgs>),
    /// Measure a server (or, with --engine, the sandbox engine alone):
    /// latency percentiles, jobs/s, warm/cold starts, interactive round trips.
    Bench(Box<crate::bench::BenchArgs>),
}

#[derive(Debug, Args)]
pub struct LanguagesArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub sandbox: SandboxSettings,
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    #[command(flatten)]
    pub sandbox: SandboxSettings,
    #[command(flatten)]
    pub redis: RedisSettings,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub sandbox: SandboxSettings,
    #[command(flatten)]
    pub redis: RedisSettings,
    #[command(flatten)]
    pub worker: WorkerSettings,
    #[command(flatten)]
    pub api: ApiSettings,
    #[command(flatten)]
    pub reaper: ReaperSettings,
}

#[derive(Debug, Args)]
pub struct ApiArgs {
    #[command(flatten)]
    pub sandbox: SandboxSettings,
    #[command(flatten)]
    pub redis: RedisSettings,
    #[command(flatten)]
    pub api: ApiSettings,
}

#[derive(Debug, Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub sandbox: SandboxSettings,
    #[command(flatten)]
    pub redis: RedisSettings,
    #[command(flatten)]
    pub worker: WorkerSettings,
    #[command(flatten)]
    pub reaper: ReaperSettings,
}

#[derive(Debug, Args)]
pub struct ReaperArgs {
    #[command(flatten)]
    pub sandbox: SandboxSettings,
    #[command(flatten)]
    pub redis: RedisSettings,
    #[command(flatten)]
    pub reaper: ReaperSettings,
}

#[derive(Debug, Subcommand)]
pub enum SandboxCommand {
    /// Run one job and stream its output; exits with the program's exit code.
    Run(Box<sandbox_run::SandboxRunArgs>),
}

/// The binary's whole `main`: logging to stderr (`CODE_RUNNER_LOG`, default
/// `warn`), a multi-threaded tokio runtime, and [`main`] on it.
///
/// A plain function, so that the binary crate instantiates no future: the
/// state machines of every command are compiled once, here, instead of a
/// second time into the binary (that second copy cost the release build
/// 88 s of its 8 minutes).
pub fn run() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CODE_RUNNER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(main()),
        Err(error) => {
            eprintln!("code-runner: cannot start the async runtime: {error}");
            ExitCode::from(70)
        }
    }
}

/// Parses the command line and runs the command. Only this function decides
/// the process exit code.
pub async fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let code = match error.kind() {
                clap::error::ErrorKind::DisplayHelp
                | clap::error::ErrorKind::DisplayVersion
                | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => 0,
                _ => exit::USAGE,
            };
            let _ = error.print();
            return ExitCode::from(code);
        }
    };
    let code = match cli.command {
        Command::Sandbox(SandboxCommand::Run(args)) => sandbox_run::run(*args).await,
        Command::Languages(args) => languages(&args.sandbox, args.json),
        Command::Doctor(args) => doctor::run(&args.sandbox, &args.redis).await,
        Command::Serve(args) => {
            let roles = Roles::Serve {
                api: &args.api,
                worker: &args.worker,
                reaper: &args.reaper,
            };
            crate::app::run(&args.sandbox, &args.redis, roles).await
        }
        Command::Api(args) => {
            let roles = Roles::Api { api: &args.api };
            crate::app::run(&args.sandbox, &args.redis, roles).await
        }
        Command::Worker(args) => {
            let roles = Roles::Worker {
                worker: &args.worker,
                reaper: &args.reaper,
            };
            crate::app::run(&args.sandbox, &args.redis, roles).await
        }
        Command::Reaper(args) => {
            let roles = Roles::Reaper {
                reaper: &args.reaper,
            };
            crate::app::run(&args.sandbox, &args.redis, roles).await
        }
        Command::Run(args) => crate::client::run(*args).await,
        Command::Capacity(args) => crate::client::capacity::run(*args).await,
        Command::Usage(args) => crate::client::usage::run(*args).await,
        Command::Bench(args) => crate::bench::run(*args).await,
    };
    ExitCode::from(code)
}

fn languages(settings: &SandboxSettings, json: bool) -> u8 {
    let setup = match settings.build("cli") {
        Ok(setup) => setup,
        Err(error) => {
            eprintln!("code-runner: {error}");
            return exit::USAGE;
        }
    };
    if json {
        match serde_json::to_string_pretty(setup.catalog.all()) {
            Ok(text) => println!("{text}"),
            Err(error) => {
                eprintln!("code-runner: {error}");
                return exit::PLATFORM_ERROR;
            }
        }
        return 0;
    }
    println!(
        "{:<12} {:<10} {:<24} {:<28} ALIASES",
        "ID", "VERSION", "NAME", "IMAGE"
    );
    for language in setup.catalog.all() {
        println!(
            "{:<12} {:<10} {:<24} {:<28} {}",
            language.id,
            language.version,
            language.name,
            language.image_ref(),
            language.aliases.join(", ")
        );
    }
    0
}
