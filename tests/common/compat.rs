//! The published Piston and Judge0 clients, installed by
//! `scripts/compat-clients` under `target/compat-clients/` (once per test
//! process; the script is idempotent and says what it installs).

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The folder of the installed clients; installs them first if needed.
pub fn clients() -> PathBuf {
    static INSTALLED: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
            let output = Command::new(root.join("scripts/compat-clients"))
                .output()
                .map_err(|e| format!("cannot run scripts/compat-clients: {e}"))?;
            print!("{}", String::from_utf8_lossy(&output.stdout));
            if !output.status.success() {
                return Err(format!(
                    "scripts/compat-clients failed ({}):\n{}{}",
                    output.status,
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                ));
            }
            Ok(root.join("target/compat-clients"))
        })
        .clone()
        .unwrap_or_else(|message| panic!("{message}"))
}

/// Runs the piston-client driver (`tests/compat/piston.mjs`) and parses
/// what it printed.
pub fn piston_client(server: &str, args: &[&str]) -> serde_json::Value {
    let dir = clients().join("node/node_modules/piston-client");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/compat/piston.mjs");
    let output = Command::new("node")
        .arg(script)
        .arg(server)
        .args(args)
        .env("PISTON_CLIENT_DIR", dir)
        .output()
        .expect("node runs");
    assert!(
        output.status.success(),
        "piston-client driver failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "piston-client printed no JSON ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

/// The Python of the venv holding the judge0 SDK.
pub fn judge0_python() -> PathBuf {
    clients().join("venv/bin/python")
}

/// The settings of a `serve` that takes keyless loopback Piston requests as
/// key `a` (with at most `max_active` jobs at once when given), key `b`
/// beside it, two sandboxes, and a catalog (written into `dir`) of every
/// language plus COBOL, whose image no worker has.
pub fn piston_settings(
    dir: &std::path::Path,
    max_active: Option<u32>,
) -> Vec<(&'static str, String)> {
    use crate::common::client::{KEY_A, KEY_B};
    let keys = match max_active {
        Some(n) => format!("a:{KEY_A}:{n},b:{KEY_B}"),
        None => format!("a:{KEY_A},b:{KEY_B}"),
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut catalog = std::fs::read_to_string(root.join("runner-images/languages.toml"))
        .expect("runner-images/languages.toml reads");
    catalog.push_str(
        "\n[[language]]\nid = \"cobol\"\nname = \"COBOL\"\nversion = \"3.1\"\n\
         image = \"code-runner/does-not-exist\"\nsource_file = \"main.cob\"\nrun = [\"cobc\"]\n",
    );
    let path = dir.join("languages.toml");
    std::fs::write(&path, catalog).expect("the catalog is written");
    vec![
        ("CODE_RUNNER_API_KEYS", keys),
        ("CODE_RUNNER_PISTON_LOOPBACK_KEY", "a".to_string()),
        ("CODE_RUNNER_WORKER_MAX_SANDBOXES", "2".to_string()),
        ("CODE_RUNNER_LANGUAGES_FILE", path.display().to_string()),
    ]
}
