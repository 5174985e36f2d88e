//! `provision-pool prewarm`: the window set on the autoscaler's Machine,
//! and the refusals of more Machines than the pool has and of times
//! without a zone.

use super::*;

#[test]
fn prewarm_sets_the_window_on_the_autoscaler_machine() {
    let mut s = Scenario::new();
    s.ok(&format!("machine list -a {APP} --json"), four_machines())
        .ok(&format!("machine list -a {AS} --json"), list(&[autoscaler("started", json!({}))]))
        .ok(
            &format!("machine update {AUTOSCALER} -a {AS} --env CR_PREWARM_MACHINES=3 --env CR_PREWARM_FROM=1893484800 --env CR_PREWARM_UNTIL=1893492000 --yes"),
            "Updating machine e2865013a90d68\n",
        );
    let outcome = s.run_all(&[
        "prewarm",
        "3",
        "--at",
        "2030-01-01T09:00:00+01:00",
        "--until",
        "2030-01-01T11:00:00+01:00",
    ]);
    assert_eq!(outcome.code, Some(0), "stderr:\n{}", outcome.stderr);
    assert!(
        outcome
            .stderr
            .contains("keeps at least 3 worker Machines started")
    );
    assert!(outcome.stderr.contains("CODE_RUNNER_WARM"));
}

#[test]
fn prewarm_refuses_more_machines_than_the_pool_has_and_times_without_a_zone() {
    let mut s = Scenario::new();
    s.ok(&format!("machine list -a {APP} --json"), four_machines());
    let outcome = s.run_all(&[
        "prewarm",
        "6",
        "--at",
        "2030-01-01T09:00:00Z",
        "--until",
        "2030-01-01T11:00:00Z",
    ]);
    assert_failed(
        &outcome,
        "prewarm",
        &[
            "the pool has 4 Machines, fewer than 6",
            "run provision-pool grow 2 first",
        ],
    );

    // The autoscaler's own maximum (deploy-fly/autoscaler/fly.toml) caps it too.
    let mut s = Scenario::new();
    s.ok(&format!("machine list -a {APP} --json"), four_machines())
        .ok(
            &format!("machine list -a {AS} --json"),
            list(&[autoscaler(
                "started",
                json!({"FAS_STARTED_MACHINE_COUNT": "min(max(ceil(load / 8), 1), 2)"}),
            )]),
        );
    let outcome = s.run_all(&[
        "prewarm",
        "3",
        "--at",
        "2030-01-01T09:00:00Z",
        "--until",
        "2030-01-01T11:00:00Z",
    ]);
    assert_failed(
        &outcome,
        "prewarm",
        &[&format!(
            "the autoscaler starts at most 2 Machines (FAS_STARTED_MACHINE_COUNT on {AUTOSCALER}), fewer than 3"
        )],
    );

    let s = Scenario::new();
    let outcome = s.run_all(&[
        "prewarm",
        "2",
        "--at",
        "2030-01-01T09:00:00",
        "--until",
        "2030-01-01T11:00:00Z",
    ]);
    assert_failed(
        &outcome,
        "prewarm",
        &["--at '2030-01-01T09:00:00' has no time zone"],
    );

    let s = Scenario::new();
    let outcome = s.run_all(&[
        "prewarm",
        "2",
        "--at",
        "2030-01-01T11:00:00Z",
        "--until",
        "2030-01-01T09:00:00Z",
    ]);
    assert_failed(&outcome, "prewarm", &["--until must be after --at"]);
}
