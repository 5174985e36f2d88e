//! `code-runner usage`: a key's usage ledger from a running API
//! (`GET /v1/usage`), per UTC day and per user, as a table or `--json`.
//!
//! Exit codes: 0 done; 64 a refused key, a key without the admin scope for
//! `--key`, or a bad date (the line names the parameter); 69 the API
//! cannot be reached or is unavailable; 70 an answer that does not parse.

use std::time::Duration;

use clap::Args;
use serde_json::Value;

use crate::exit;

const TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Debug, Args)]
pub struct UsageArgs {
    /// First day (YYYY-MM-DD, UTC; default: TO).
    #[arg(long)]
    pub from: Option<String>,
    /// Last day (YYYY-MM-DD, UTC; default: today).
    #[arg(long)]
    pub to: Option<String>,
    /// Only this user's figures (`""`: the key's anonymous user).
    #[arg(long)]
    pub user: Option<String>,
    /// Another key's usage, by name (needs an API key with the admin scope).
    #[arg(long)]
    pub key: Option<String>,
    /// URL of the code-runner API.
    #[arg(long, env = "CODE_RUNNER_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// The API key (sent as `Authorization: Bearer`).
    #[arg(long, env = "CODE_RUNNER_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Print the API's JSON answer instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(args: UsageArgs) -> u8 {
    let Some(key) = args.api_key.clone().filter(|k| !k.is_empty()) else {
        return fail(exit::USAGE, "CODE_RUNNER_API_KEY is not set");
    };
    let base = args.url.trim_end_matches('/').to_string();
    let query: Vec<(&str, &str)> = [
        ("from", &args.from),
        ("to", &args.to),
        ("user", &args.user),
        ("key", &args.key),
    ]
    .into_iter()
    .filter_map(|(name, value)| Some((name, value.as_deref()?)))
    .collect();
    let http = match reqwest::Client::builder().timeout(TIMEOUT).build() {
        Ok(http) => http,
        Err(error) => return fail(exit::PLATFORM_ERROR, error),
    };
    let url = match reqwest::Url::parse_with_params(&format!("{base}/v1/usage"), &query) {
        Ok(url) => url,
        Err(error) => return fail(exit::USAGE, format!("CODE_RUNNER_URL: {base}: {error}")),
    };
    let response = match http.get(url).bearer_auth(key).send().await {
        Ok(response) => response,
        Err(error) => return fail(exit::UNAVAILABLE, format!("cannot reach {base}: {error}")),
    };
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    if !status.is_success() {
        let (code, message) = super::refusal(status, &text);
        return fail(code, message);
    }
    let value = match super::answer_json(&text) {
        Ok(value) => value,
        Err(message) => return fail(exit::PLATFORM_ERROR, message),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&value).unwrap_or(text));
    } else {
        print!("{}", table(&value));
    }
    0
}

/// The answer as a table: per day a row for the key (`*`) and one per
/// user (`-`: the anonymous user), then the range's total.
pub fn table(value: &Value) -> String {
    let mut out = format!(
        "key {}, {} to {} (UTC)\n",
        value["key"].as_str().unwrap_or(""),
        value["from"].as_str().unwrap_or(""),
        value["to"].as_str().unwrap_or("")
    );
    out.push_str(&format!(
        "{:<10}  {:<24} {:>8} {:>10} {:>12} {:>12} {:>14}\n",
        "DATE", "USER", "JOBS", "SUBMITTED", "CPU_MS", "WALL_MS", "OUTPUT_BYTES"
    ));
    let mut rows = |date: &str, figures: &Value| {
        let row = |user: &str, f: &Value| {
            let n = |name: &str| f[name].as_u64().unwrap_or(0);
            format!(
                "{:<10}  {:<24} {:>8} {:>10} {:>12} {:>12} {:>14}\n",
                date,
                user,
                n("jobs"),
                n("submitted"),
                n("cpu_ms"),
                n("wall_ms"),
                n("output_bytes")
            )
        };
        out.push_str(&row("*", figures));
        if let Some(users) = figures["users"].as_object() {
            for (user, f) in users {
                out.push_str(&row(if user.is_empty() { "-" } else { user }, f));
            }
        }
    };
    for day in value["days"].as_array().map_or(&[][..], Vec::as_slice) {
        rows(day["date"].as_str().unwrap_or(""), day);
    }
    rows("total", &value["total"]);
    out
}

fn fail(code: u8, message: impl std::fmt::Display) -> u8 {
    eprintln!("code-runner: {message}");
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_a_row_per_day_and_user_and_the_total() {
        let figures = |jobs: u64, cpu_ms: u64| serde_json::json!({"jobs": jobs, "cpu_ms": cpu_ms, "wall_ms": 7, "output_bytes": 3, "submitted": jobs});
        let mut day = figures(2, 30);
        day["date"] = "2026-12-01".into();
        day["users"] = serde_json::json!({"": figures(1, 10), "ann": figures(1, 20)});
        let mut total = figures(2, 30);
        total["users"] = day["users"].clone();
        let answer = serde_json::json!({"key": "k", "from": "2026-12-01", "to": "2026-12-02",
            "days": [day], "total": total});
        let text = table(&answer);
        let lines: Vec<Vec<&str>> = text
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            lines[0],
            ["key", "k,", "2026-12-01", "to", "2026-12-02", "(UTC)"]
        );
        assert_eq!(lines[2], ["2026-12-01", "*", "2", "2", "30", "7", "3"]);
        assert_eq!(lines[3], ["2026-12-01", "-", "1", "1", "10", "7", "3"]);
        assert_eq!(lines[4], ["2026-12-01", "ann", "1", "1", "20", "7", "3"]);
        assert_eq!(lines[5], ["total", "*", "2", "2", "30", "7", "3"]);
        assert_eq!(lines.len(), 8);
    }
}
