//! The keys `scripts/up` gives a new install (`scripts/lib/keys.sh`), made
//! in a directory of the test's own.

use std::path::Path;
use std::process::Command;

/// Runs `ensure_api_keys <state>` and then prints `api_keys_setting
/// <state>`; returns what `ensure_api_keys` said and the setting.
pub fn ensure_keys(state: &Path) -> (String, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/lib/keys.sh");
    let output = Command::new("bash")
        .arg("-euc")
        .arg(r#"source "$1"; ensure_api_keys "$2" >&2; api_keys_setting "$2""#)
        .arg("keys")
        .arg(&script)
        .arg(state)
        .output()
        .expect("bash runs");
    assert!(
        output.status.success(),
        "scripts/lib/keys.sh failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    (
        String::from_utf8(output.stderr).expect("utf-8"),
        String::from_utf8(output.stdout).expect("utf-8"),
    )
}

/// The key in `<state>/<file>`.
pub fn read_key(state: &Path, file: &str) -> String {
    std::fs::read_to_string(state.join(file)).expect("the key file")
}
