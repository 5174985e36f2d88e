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
