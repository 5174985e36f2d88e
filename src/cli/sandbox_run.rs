//! `code-runner sandbox run FILE…`: one job straight through the sandbox
//! engine, with no Redis and no API. For operators checking an install, and
//! for tests.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;

use base64::Engine as _;
use clap::Args;
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;

use crate::config::SandboxSettings;
use crate::exit;
use crate::job::limits::{CompileLimitsRequest, LimitsRequest};
use crate::job::{Encoding, FileSpec, JobSpec, prepare};
use crate::sandbox::{JobInput, JobIo, SandboxEngine, SandboxEvent};

#[derive(Debug, Args)]
pub struct SandboxRunArgs {
    /// Source files; the first is the entry unless --entry names another.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Language id or alias; guessed from the first file's extension if unset.
    #[arg(short, long)]
    pub language: Option<String>,
    /// Input for the program: the text itself, or `-` to read the terminal's stdin.
    #[arg(long)]
    pub stdin: Option<String>,
    /// Interactive: what you type reaches the program live.
    #[arg(short, long, conflicts_with = "stdin")]
    pub interactive: bool,
    /// Print the full result as JSON at the end instead of streaming output.
    #[arg(long)]
    pub json: bool,
    /// The entry file (a file name as given to the sandbox: the base name).
    #[arg(long)]
    pub entry: Option<String>,
    /// An argument for the program (repeatable).
    #[arg(long = "arg", allow_hyphen_values = true)]
    pub args: Vec<String>,
    /// An environment variable NAME=VALUE for the program (repeatable).
    #[arg(long = "env")]
    pub env: Vec<String>,
    #[arg(long)]
    pub wall_ms: Option<u64>,
    #[arg(long)]
    pub idle_ms: Option<u64>,
    #[arg(long)]
    pub cpu_ms: Option<u64>,
    #[arg(long)]
    pub memory_mb: Option<u64>,
    #[arg(long)]
    pub pids: Option<u64>,
    #[arg(long)]
    pub output_bytes: Option<u64>,
    #[arg(long)]
    pub disk_mb: Option<u64>,
    #[arg(long)]
    pub files_bytes: Option<u64>,
    #[arg(long)]
    pub compile_wall_ms: Option<u64>,
    #[arg(long)]
    pub compile_cpu_ms: Option<u64>,
    #[arg(long)]
    pub compile_output_bytes: Option<u64>,
}

fn fail(code: u8, message: impl std::fmt::Display) -> u8 {
    eprintln!("code-runner: {message}");
    code
}

pub async fn run(settings: &SandboxSettings, args: SandboxRunArgs) -> u8 {
    let worker_id = format!("cli-{}", uuid::Uuid::new_v4());
    let setup = match settings.build(&worker_id) {
        Ok(setup) => setup,
        Err(error) => return fail(exit::USAGE, error),
    };
    let spec = match job_spec(&args, &setup.catalog).await {
        Ok(spec) => spec,
        Err(message) => return fail(exit::USAGE, message),
    };
    let job = match prepare(&spec, &setup.catalog, &setup.policy) {
        Ok(job) => job,
        Err(error) => return fail(exit::USAGE, format!("invalid job: {error}")),
    };
    let engine = match SandboxEngine::connect(setup.sandbox).await {
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

async fn job_spec(
    args: &SandboxRunArgs,
    catalog: &crate::languages::LanguageCatalog,
) -> Result<JobSpec, String> {
    let mut files = Vec::new();
    for path in &args.files {
        let bytes =
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| format!("{} has no usable file name", path.display()))?
            .to_string();
        let (content, encoding) = match String::from_utf8(bytes) {
            Ok(text) => (text, Encoding::Utf8),
            Err(error) => (
                base64::engine::general_purpose::STANDARD.encode(error.into_bytes()),
                Encoding::Base64,
            ),
        };
        files.push(FileSpec {
            name,
            content,
            encoding,
        });
    }
    let language = match &args.language {
        Some(language) => language.clone(),
        None => catalog
            .for_file_name(&files[0].name)
            .map(|l| l.id.clone())
            .ok_or_else(|| {
                format!(
                    "cannot tell the language of {}; pass --language",
                    files[0].name
                )
            })?,
    };
    let stdin = match args.stdin.as_deref() {
        None => Vec::new(),
        Some("-") => {
            let mut data = Vec::new();
            tokio::io::stdin()
                .read_to_end(&mut data)
                .await
                .map_err(|e| format!("cannot read stdin: {e}"))?;
            data
        }
        Some(text) => text.as_bytes().to_vec(),
    };
    let (stdin, stdin_encoding) = match String::from_utf8(stdin) {
        Ok(text) => (text, Encoding::Utf8),
        Err(error) => (
            base64::engine::general_purpose::STANDARD.encode(error.into_bytes()),
            Encoding::Base64,
        ),
    };
    let mut env = BTreeMap::new();
    for item in &args.env {
        let (name, value) = item
            .split_once('=')
            .ok_or_else(|| format!("--env {item:?} is not NAME=VALUE"))?;
        env.insert(name.to_string(), value.to_string());
    }
    Ok(JobSpec {
        language,
        files,
        entry: args.entry.clone(),
        stdin,
        stdin_encoding,
        args: args.args.clone(),
        env,
        interactive: args.interactive,
        limits: LimitsRequest {
            wall_ms: args.wall_ms,
            idle_ms: args.idle_ms,
            cpu_ms: args.cpu_ms,
            memory_mb: args.memory_mb,
            pids: args.pids,
            output_bytes: args.output_bytes,
            disk_mb: args.disk_mb,
            files_bytes: args.files_bytes,
        },
        compile_limits: CompileLimitsRequest {
            wall_ms: args.compile_wall_ms,
            cpu_ms: args.compile_cpu_ms,
            output_bytes: args.compile_output_bytes,
        },
        ..Default::default()
    })
}
