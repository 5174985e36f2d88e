//! `code-runner capacity set|list|clear`: the warm capacity schedule of a
//! running API (`/v1/capacity`) from the shell, with an admin key.
//!
//! Exit codes: 0 done; 64 a refused key, a key without the admin scope or
//! a bad entry (the line names the field); 69 the API cannot be reached or
//! is unavailable; 70 an answer that does not parse.

use std::time::Duration;

use clap::{Args, Subcommand};
use reqwest::Method;

use crate::exit;

const TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Debug, Args)]
pub struct CapacityArgs {
    #[command(subcommand)]
    pub command: CapacityCommand,
    /// URL of the code-runner API.
    #[arg(
        long,
        global = true,
        env = "CODE_RUNNER_URL",
        default_value = "http://127.0.0.1:8080"
    )]
    pub url: String,
    /// An API key with the admin scope (sent as `Authorization: Bearer`).
    #[arg(
        long,
        global = true,
        env = "CODE_RUNNER_API_KEY",
        hide_env_values = true
    )]
    pub api_key: Option<String>,
    /// Print the API's JSON answer instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum CapacityCommand {
    /// Hold WARM ready sandboxes of LANGUAGE across the fleet from FROM
    /// (default: now) until UNTIL (RFC 3339 UTC, e.g. 2026-12-01T09:55:00Z).
    Set {
        #[arg(long)]
        language: String,
        #[arg(long)]
        warm: u64,
        #[arg(long)]
        from: Option<String>,
        #[arg(long)]
        until: String,
    },
    /// The schedule, and what the fleet holds ready now.
    List,
    /// End an entry of the schedule.
    Clear {
        /// The entry's id (from `list`).
        id: String,
    },
}

pub async fn run(args: CapacityArgs) -> u8 {
    let Some(key) = args.api_key.clone().filter(|k| !k.is_empty()) else {
        return fail(
            exit::USAGE,
            "CODE_RUNNER_API_KEY is not set: an API key with the admin scope",
        );
    };
    let base = args.url.trim_end_matches('/').to_string();
    let (method, path, body) = match &args.command {
        CapacityCommand::Set {
            language,
            warm,
            from,
            until,
        } => {
            let mut body = serde_json::json!({"language": language, "warm": warm, "until": until});
            if let Some(from) = from {
                body["from"] = serde_json::Value::String(from.clone());
            }
            (Method::PUT, "/v1/capacity".to_string(), Some(body))
        }
        CapacityCommand::List => (Method::GET, "/v1/capacity".to_string(), None),
        CapacityCommand::Clear { id } => (Method::DELETE, format!("/v1/capacity/{id}"), None),
    };
    let http = match reqwest::Client::builder().timeout(TIMEOUT).build() {
        Ok(http) => http,
        Err(error) => return fail(exit::PLATFORM_ERROR, error),
    };
    let mut request = http
        .request(method, format!("{base}{path}"))
        .bearer_auth(key);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = match request.send().await {
        Ok(response) => response,
        Err(error) => return fail(exit::UNAVAILABLE, format!("cannot reach {base}: {error}")),
    };
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    if !status.is_success() {
        let (code, message) = super::refusal(status, &text);
        return fail(code, message);
    }
    if matches!(args.command, CapacityCommand::Clear { .. }) {
        return 0;
    }
    let value = match super::answer_json(&text) {
        Ok(value) => value,
        Err(message) => return fail(exit::PLATFORM_ERROR, message),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&value).unwrap_or(text));
        return 0;
    }
    match args.command {
        CapacityCommand::Set { .. } => print_entries(std::slice::from_ref(&value)),
        _ => print_schedule(&value),
    }
    0
}

fn print_entries(entries: &[serde_json::Value]) {
    println!(
        "{:<36} {:<12} {:>6} {:<24} {:<24} ACTIVE",
        "ID", "LANGUAGE", "WARM", "FROM", "UNTIL"
    );
    for entry in entries {
        println!(
            "{:<36} {:<12} {:>6} {:<24} {:<24} {}",
            entry["id"].as_str().unwrap_or(""),
            entry["language"].as_str().unwrap_or(""),
            entry["warm"].as_u64().unwrap_or(0),
            entry["from"].as_str().unwrap_or(""),
            entry["until"].as_str().unwrap_or(""),
            if entry["active"].as_bool() == Some(true) {
                "yes"
            } else {
                "no"
            },
        );
    }
}

fn print_schedule(value: &serde_json::Value) {
    print_entries(value["entries"].as_array().map_or(&[][..], Vec::as_slice));
    println!();
    println!("live workers: {}", value["workers"].as_u64().unwrap_or(0));
    let held = value["memory_held_workers"].as_u64().unwrap_or(0);
    if held > 0 {
        println!(
            "{held} of them start no warm sandbox: their machine has less memory available than CODE_RUNNER_WARM_MEMORY_RESERVE_MB"
        );
    }
    println!(
        "{:<12} {:>6} {:>7} {:>6}  HELD",
        "LANGUAGE", "FLOOR", "TARGET", "READY"
    );
    if let Some(languages) = value["languages"].as_object() {
        for (language, figures) in languages {
            let missing = figures["missing"].as_u64().unwrap_or(0);
            println!(
                "{:<12} {:>6} {:>7} {:>6}  {}",
                language,
                figures["floor"].as_u64().unwrap_or(0),
                figures["target"].as_u64().unwrap_or(0),
                figures["ready"].as_u64().unwrap_or(0),
                if missing > 0 {
                    format!("short by {missing}: add workers or raise CODE_RUNNER_WARM_MAX")
                } else {
                    "yes".to_string()
                },
            );
        }
    }
}

fn fail(code: u8, message: impl std::fmt::Display) -> u8 {
    eprintln!("code-runner: {message}");
    code
}
