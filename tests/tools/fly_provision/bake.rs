//! `provision-pool bake`: a bake Machine boots on a new golden volume, the
//! volume is snapshotted and the snapshot's id printed, the autoscaler
//! stopped meanwhile and started again; a bake Machine that exits non-zero,
//! a snapshot that fails, and a bake Machine left from before.

use super::*;

const BAKE: &str = "3287e4f9a01e58";

/// The calls of a bake up to the bake Machine stopping with `exit_code`.
fn bake_until_stopped(s: &mut Scenario, exit_code: i64) {
    let template = machine(TEMPLATE, "stopped", TEMPLATE_VOL);
    s.ok(&format!("machine list -a {APP} --json"), list(std::slice::from_ref(&template)))
        .ok(
            &format!("machine list -a {AS} --json"),
            list(&[autoscaler("started", json!({}))]),
        )
        .ok(
            &format!("machine stop {AUTOSCALER} -a {AS}"),
            format!("Sending kill signal to machine {AUTOSCALER}...\n{AUTOSCALER} has been successfully stopped\n"),
        )
        .ok(
            &format!("volumes list -a {APP} --json"),
            list(&[volume(TEMPLATE_VOL, "cr_data", Some(TEMPLATE))]),
        )
        .ok(
            &format!("volumes create cr_golden -a {APP} -r ams -s 20 --snapshot-retention 60 --require-unique-zone=false -y --json"),
            serde_json::to_string_pretty(&volume(GOLDEN_VOL, "cr_golden", None)).unwrap(),
        )
        .ok(
            &format!("machine clone {TEMPLATE} -a {APP} --region ams --attach-volume {GOLDEN_VOL}:/data --override-cmd bake --name cr-bake --detach"),
            format!("Cloning Machine {TEMPLATE} into region ams\nAttaching existing volume {GOLDEN_VOL}\nProvisioning a new Machine with image registry.fly.io/code-runner-workers:v1...\n  Machine {BAKE} has been created...\n"),
        )
        .ok(
            &format!("machine list -a {APP} --json"),
            list(&[template.clone(), bake_machine(BAKE, "started", None)]),
        )
        .ok(
            &format!("machine list -a {APP} --json"),
            list(&[template.clone(), bake_machine(BAKE, "started", None)]),
        )
        .ok(
            &format!("machine list -a {APP} --json"),
            list(&[template, bake_machine(BAKE, "stopped", Some(exit_code))]),
        );
}

#[test]
fn bake_boots_a_bake_machine_snapshots_the_golden_volume_and_prints_the_snapshot_id() {
    let mut s = Scenario::new();
    bake_until_stopped(&mut s, 0);
    s.ok(
        &format!("volumes snapshots list {GOLDEN_VOL} -a {APP} --json"),
        list(&[]),
    )
    .ok(
        &format!("volumes snapshots create {GOLDEN_VOL} -a {APP}"),
        format!("Scheduled to snapshot volume {GOLDEN_VOL}\n"),
    )
    .ok(
        &format!("volumes snapshots list {GOLDEN_VOL} -a {APP} --json"),
        list(&[snapshot("", "pending", &ago(5))]),
    )
    .ok(
        &format!("volumes snapshots list {GOLDEN_VOL} -a {APP} --json"),
        list(&[snapshot("vs_N3wG0ld3n5nap", "created", &ago(1))]),
    )
    .ok(
        &format!("machine destroy {BAKE} -a {APP}"),
        format!("{BAKE} has been destroyed\n"),
    )
    .ok(
        &format!("machine start {AUTOSCALER} -a {AS}"),
        format!("{AUTOSCALER} has been started\n"),
    );
    let outcome = s.run_all(&["bake"]);
    assert_eq!(outcome.code, Some(0), "stderr:\n{}", outcome.stderr);
    assert_eq!(outcome.stdout, "vs_N3wG0ld3n5nap\n");
    assert!(outcome.stderr.contains("autoscaler paused (1 Machine(s)"));
    assert!(outcome.stderr.contains("autoscaler resumed"));
}

#[test]
fn bake_whose_machine_exits_nonzero_removes_it_resumes_the_autoscaler_and_says_where_to_look() {
    let mut s = Scenario::new();
    bake_until_stopped(&mut s, 1);
    s.ok(&format!("machine destroy --force {BAKE} -a {APP}"), "")
        .ok(&format!("machine start {AUTOSCALER} -a {AS}"), "");
    let outcome = s.run_all(&["bake"]);
    assert_failed(
        &outcome,
        "bake",
        &[
            &format!("the bake Machine {BAKE} exited with 1"),
            &format!("flyctl logs -a {APP} -i {BAKE}"),
        ],
    );
    assert_eq!(outcome.stdout, "");
}

#[test]
fn bake_failing_at_the_snapshot_with_the_autoscaler_not_restarting_says_how_to_resume_it() {
    let mut s = Scenario::new();
    bake_until_stopped(&mut s, 0);
    s.ok(
        &format!("volumes snapshots list {GOLDEN_VOL} -a {APP} --json"),
        list(&[]),
    )
    .fail(
        &format!("volumes snapshots create {GOLDEN_VOL} -a {APP}"),
        "Error: failed to create volume snapshot: 503 Service Unavailable",
    )
    .ok(&format!("machine destroy --force {BAKE} -a {APP}"), "")
    .fail(
        &format!("machine start {AUTOSCALER} -a {AS}"),
        "Error: could not start machine: timeout",
    );
    let outcome = s.run_all(&["bake"]);
    assert_failed(
        &outcome,
        "bake",
        &[
            &format!(
                "'volumes snapshots create {GOLDEN_VOL} -a {APP}' exited with 1: Error: failed to create volume snapshot: 503 Service Unavailable"
            ),
            &format!(
                "the autoscaler is still paused: start it with flyctl machine start {AUTOSCALER} -a {AS}"
            ),
        ],
    );
}

#[test]
fn bake_refuses_while_a_bake_machine_exists() {
    let mut s = Scenario::new();
    s.ok(
        &format!("machine list -a {APP} --json"),
        list(&[
            machine(TEMPLATE, "stopped", TEMPLATE_VOL),
            bake_machine(BAKE, "stopped", Some(1)),
        ]),
    );
    let outcome = s.run_all(&["bake"]);
    assert_failed(
        &outcome,
        "bake",
        &[
            &format!("a bake Machine exists already ({BAKE})"),
            &format!("flyctl machine destroy --force {BAKE} -a {APP}"),
        ],
    );
}
