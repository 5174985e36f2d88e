//! `code-runner sandbox run FILE…`: one job straight through the sandbox
//! engine, with no Redis and no API. For operators checking an install, and
//! for tests.

use std::io::Write as _;

use clap::Args;
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;

use crate::client::JobArgs;
use crate::config::SandboxSettings;
use crate::exit;
use crate::job::prepare;
use crate::sandbox::{DockerEngine, JobInput, JobIo, SandboxEngine as _, SandboxEvent};

#[derive(Debug, Args)]
pub struct SandboxRunArgs {
    #[command(flatten)]
    pub job: JobArgs,
    #[command(flatten)]
    pub sandbox: SandboxSettings,
    /// Interactive: what you type reaches the program live.
    #[arg(short, long, conflicts_with = "stdin")]
    pub interactive: bool,
    /// Print the full result as JSON at the end instead of streaming output.
    #[arg(long)]
    pub json: bool,
}

fn fail(code: u8, message: impl std::fmt::Display) -> u8 {
    eprintln!("code-runner: {message}");
    code
}

pub async fn run(args: SandboxRunArgs) -> u8 {
    let worker_id = format!("cli-{}", uuid::Uuid::new_v4());
    let setup = match args.sandbox.build(&worker_id) {
        Ok(setup) => setup,
        Err(error) => return fail(exit::USAGE, error),
    };
    let spec = match args.job.job_spec(&setup.catalog, args.interactive).await {
        Ok(spec) => spec,
        Err(message) => return fail(exit::USAGE, message),
    };
    let job = match prepare(&spec, &setup.catalog, &setup.policy) {
        Ok(job) => job,
        Err(error) => return fail(exit::USAGE, format!("invalid job: {error}")),
    };
    let engine = match DockerEngine::connect(setup.sandbox).await {
        Ok(engine) => engine,
        Err(error) => return fail(exit::UNAVAILABLE, error),
    };

    let (events_tx, mut events) = mpsc::channel(256);
    let mut io = JobIo {
        events: Some(events_tx),
        ..Default::default()
    };
    if args.interactive {
        let (input_tx, input_rx) = mpsc::channel(64);
        io.input = Some(input_rx);
        tokio::spawn(forward_terminal_input(input_tx));
    }
    let cancel = io.cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            cancel.cancel();
        }
    });

    let job_id = uuid::Uuid::new_v4().to_string();
    let stream = !args.json;
    let printer = tokio::spawn(async move {
        while let Some(event) = events.recv().await {
            if !stream {
                continue;
            }
            match event {
                SandboxEvent::Stdout(data) => {
                    let mut out = std::io::stdout().lock();
                    let _ = out.write_all(&data);
                    let _ = out.flush();
                }
                SandboxEvent::Stderr(data) => {
                    let mut err = std::io::stderr().lock();
                    let _ = err.write_all(&data);
                    let _ = err.flush();
                }
                _ => {}
            }
        }
    });
    let result = engine.run(&job_id, &job, io).await;
    let _ = printer.await;

    let (code, message) = exit::for_result(&result);
    if args.json {
        match serde_json::to_string_pretty(&result) {
            Ok(text) => println!("{text}"),
            Err(error) => return fail(exit::PLATFORM_ERROR, error),
        }
    } else if let Some(message) = message {
        eprintln!("code-runner: {message}");
    }
    code
}

async fn forward_terminal_input(input: mpsc::Sender<JobInput>) {
    let mut stdin = tokio::io::stdin();
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        match stdin.read(&mut buffer).await {
            Ok(0) | Err(_) => {
                let _ = input.send(JobInput::StdinClose).await;
                return;
            }
            Ok(n) => {
                if input
                    .send(JobInput::Stdin(buffer[..n].to_vec()))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
    }
}
