//! The supervisor keeps off the daemon's dependencies.
//!
//! `code-runner-init` is built statically for every runner image and runs as
//! PID 1 of every sandbox, where there is no network: it needs no HTTP,
//! Docker or Redis client, no metrics and no socket I/O, and compiling them
//! would make its build minutes instead of seconds. The compiler keeps that
//! true only as long as the crate does not depend on them, which this test
//! checks in the crate's dependency tree (normal, build and dev
//! dependencies, with features) as `cargo tree` resolves it. `scripts/test`
//! makes the same check right after clippy.

use std::path::Path;
use std::process::Command;

/// Crates the supervisor must not depend on, directly or not.
const FORBIDDEN_CRATES: &[&str] = &[
    "axum",
    "bollard",
    "redis",
    "hyper",
    "reqwest",
    "tokio-tungstenite",
    "prometheus",
];

/// Features the supervisor must not enable, as `(crate, feature)`. tokio's
/// `net` is sockets and readiness on file descriptors; its `signal` feature
/// uses mio's networking internally but does not enable tokio's `net`.
const FORBIDDEN_FEATURES: &[(&str, &str)] = &[("tokio", "net")];

const PACKAGE: &str = "code-runner-init";

fn cargo_tree(extra: &[&str]) -> String {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"));
    let output = Command::new(env!("CARGO"))
        .args(["tree", "--locked", "-p", PACKAGE, "-e", "features"])
        .args(extra)
        .current_dir(workspace)
        .output()
        .expect("run cargo tree");
    assert!(
        output.status.success(),
        "cargo tree -p {PACKAGE} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("cargo tree prints UTF-8")
}

/// What of [`FORBIDDEN_CRATES`] and [`FORBIDDEN_FEATURES`] appears in the
/// text of `cargo tree --prefix none -e features`: lines `name vX.Y.Z ...`
/// for packages and `name feature "f"` for features.
fn offenders(tree: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in tree.lines() {
        let line = line.trim_end_matches(" (*)").trim();
        let Some((name, rest)) = line.split_once(' ') else {
            continue;
        };
        let offence = if let Some(feature) = rest.strip_prefix("feature ") {
            let feature = feature.trim_matches('"');
            FORBIDDEN_FEATURES
                .contains(&(name, feature))
                .then(|| format!("{name}'s feature \"{feature}\""))
        } else if rest.starts_with('v') && FORBIDDEN_CRATES.contains(&name) {
            Some(name.to_string())
        } else {
            None
        };
        if let Some(offence) = offence
            && !found.contains(&offence)
        {
            found.push(offence);
        }
    }
    found
}

#[test]
fn the_supervisor_depends_on_no_networking_crate_nor_tokio_net() {
    let tree = cargo_tree(&["--prefix", "none"]);
    assert!(
        tree.lines().any(|line| line.starts_with("tokio v")),
        "cargo tree shows no tokio at all; is this still the supervisor's tree?\n{tree}"
    );
    let found = offenders(&tree);
    if found.is_empty() {
        return;
    }
    let mut message = format!(
        "{PACKAGE} must not depend on {}; it depends on {}.\n",
        FORBIDDEN_CRATES
            .iter()
            .map(|name| name.to_string())
            .chain(
                FORBIDDEN_FEATURES
                    .iter()
                    .map(|(name, feature)| format!("{name}'s feature \"{feature}\""))
            )
            .collect::<Vec<_>>()
            .join(", "),
        found.join(", ")
    );
    for offence in &found {
        let name = offence.split('\'').next().unwrap_or(offence);
        message.push_str(&format!(
            "\nwhat brings in {offence} (cargo tree -p {PACKAGE} -e features -i {name}):\n{}",
            cargo_tree(&["-i", name])
        ));
    }
    panic!("{message}");
}

#[test]
fn offenders_are_found_in_cargo_tree_output() {
    let tree = "code-runner-init v0.1.0 (/src/crates/init)\n\
                tokio feature \"default\"\n\
                tokio v1.54.1\n\
                tokio feature \"net\" (*)\n\
                deadpool-redis v0.23.1\n\
                hyper-util v0.1.21\n\
                hyper v1.8.1 (*)\n\
                mio feature \"net\"\n";
    assert_eq!(offenders(tree), ["tokio's feature \"net\"", "hyper"]);
    assert!(offenders("tokio v1.54.1\nmio feature \"net\"\nredis-test v1.0.0\n").is_empty());
}
