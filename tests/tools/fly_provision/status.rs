//! `provision-pool status`: the pool, the golden snapshot's age and expiry
//! and the prewarm window, and a warning when the snapshot is about to
//! expire.

use super::*;

fn status_scenario(snapshot_age_days: u64, prewarm: Value) -> Scenario {
    let mut s = Scenario::new();
    s.ok(
        &format!("machine list -a {APP} --json"),
        list(&[
            machine(TEMPLATE, "stopped", TEMPLATE_VOL),
            machine(M1, "started", SPARE_VOL),
            machine(M2, "stopped", NEW_VOL),
        ]),
    )
    .ok(
        &format!("volumes list -a {APP} --json"),
        list(&[
            volume(TEMPLATE_VOL, "cr_data", Some(TEMPLATE)),
            volume(SPARE_VOL, "cr_data", Some(M1)),
            volume(NEW_VOL, "cr_data", Some(M2)),
            volume("vol_l3ft0v3rdddddd", "cr_data", None),
            volume(GOLDEN_VOL, "cr_golden", None),
        ]),
    )
    .ok(
        &format!("volumes snapshots list {GOLDEN_VOL} -a {APP} --json"),
        list(&[
            snapshot("vs_01dS5nap", "created", &ago(70 * DAY)),
            snapshot(
                "vs_N3wG0ld3n5nap",
                "created",
                &ago(snapshot_age_days * DAY + 3600),
            ),
            snapshot("", "pending", &ago(10)),
        ]),
    )
    .ok(
        &format!("machine list -a {AS} --json"),
        list(&[autoscaler("started", prewarm)]),
    );
    s
}

#[test]
fn status_reports_the_pool_the_snapshot_age_and_expiry_and_the_prewarm_window() {
    let prewarm = json!({"CR_PREWARM_MACHINES": "4", "CR_PREWARM_FROM": "1893484800", "CR_PREWARM_UNTIL": "1893492000"});
    let outcome = status_scenario(10, prewarm).run_all(&["status"]);
    assert_eq!(outcome.code, Some(0), "stderr:\n{}", outcome.stderr);
    let lines: Vec<&str> = outcome.stdout.lines().collect();
    assert_eq!(
        lines[0],
        format!("pool {APP}: 3 Machines (1 started, 2 stopped), 4 data volumes (1 unattached)")
    );
    assert!(
        lines[1].starts_with(&format!(
            "golden snapshot vs_N3wG0ld3n5nap of {GOLDEN_VOL}: created "
        )) && lines[1].contains("(10 days ago), kept 60 days: expires ")
            && lines[1].ends_with("(in 49 days)"),
        "{}",
        lines[1]
    );
    assert_eq!(
        lines[2],
        format!("autoscaler {AS}: 1 of 1 Machine(s) started")
    );
    assert_eq!(
        lines[3],
        format!(
            "  pre-warm on {AUTOSCALER}: 4 Machines from 2030-01-01T08:00:00Z until 2030-01-01T10:00:00Z (scheduled)"
        )
    );
    assert_eq!(lines.len(), 4, "{}", outcome.stdout);
}

#[test]
fn status_warns_when_the_golden_snapshot_is_about_to_expire() {
    let outcome = status_scenario(56, json!({})).run_all(&["status"]);
    assert_eq!(outcome.code, Some(0), "stderr:\n{}", outcome.stderr);
    assert!(
        outcome.stdout.contains("(56 days ago), kept 60 days"),
        "{}",
        outcome.stdout
    );
    assert!(
        outcome
            .stdout
            .contains(&format!("  pre-warm on {AUTOSCALER}: none\n"))
    );
    assert!(
        outcome
            .stdout
            .ends_with("WARNING: the golden snapshot expires in 3 days: run provision-pool bake\n"),
        "{}",
        outcome.stdout
    );
}
