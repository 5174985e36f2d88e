//! `provision-pool grow`: volumes restored from the newest golden snapshot,
//! Machines cloned and stopped; a clone that fails, no golden snapshot, and
//! a flyctl answer in a shape the command does not expect.

use super::*;

fn grow_start(s: &mut Scenario) {
    s.ok(
        &format!("volumes list -a {APP} --json"),
        list(&[
            volume(TEMPLATE_VOL, "cr_data", Some(TEMPLATE)),
            volume(GOLDEN_VOL, "cr_golden", None),
            volume(SPARE_VOL, "cr_data", None),
        ]),
    )
    .ok(
        &format!("volumes snapshots list {GOLDEN_VOL} -a {APP} --json"),
        list(&[
            snapshot("vs_01dS5nap", "created", &ago(40 * DAY)),
            snapshot("vs_N3wG0ld3n5nap", "created", &ago(2 * DAY)),
        ]),
    )
    .ok(
        &format!("machine list -a {APP} --json"),
        list(&[machine(TEMPLATE, "stopped", TEMPLATE_VOL)]),
    )
    // The spare volume (left by an interrupted grow) is used first.
    .ok(
        &format!("machine clone {TEMPLATE} -a {APP} --region ams --attach-volume {SPARE_VOL}:/data"),
        "Machine has been successfully cloned!\n",
    )
    .ok(
        &format!("machine list -a {APP} --json"),
        list(&[machine(TEMPLATE, "stopped", TEMPLATE_VOL), machine(M1, "started", SPARE_VOL)]),
    )
    .ok(&format!("machine stop {M1} -a {APP} --wait-timeout 330s"), format!("{M1} has been successfully stopped\n"))
    .ok(
        &format!("volumes create cr_data -a {APP} -r ams -s 20 --snapshot-id vs_N3wG0ld3n5nap --require-unique-zone=false -y --json"),
        serde_json::to_string_pretty(&volume(NEW_VOL, "cr_data", None)).unwrap(),
    );
}

#[test]
fn grow_restores_volumes_from_the_newest_golden_snapshot_clones_and_stops_each_machine() {
    let mut s = Scenario::new();
    grow_start(&mut s);
    s.ok(
        &format!("machine clone {TEMPLATE} -a {APP} --region ams --attach-volume {NEW_VOL}:/data"),
        "Machine has been successfully cloned!\n",
    )
    .ok(
        &format!("machine list -a {APP} --json"),
        list(&[
            machine(TEMPLATE, "stopped", TEMPLATE_VOL),
            machine(M1, "stopped", SPARE_VOL),
            machine(M2, "started", NEW_VOL),
        ]),
    )
    .ok(
        &format!("machine stop {M2} -a {APP} --wait-timeout 330s"),
        "",
    );
    let outcome = s.run_all(&["grow", "2"]);
    assert_eq!(outcome.code, Some(0), "stderr:\n{}", outcome.stderr);
    assert_eq!(outcome.stdout, format!("{M1}\n{M2}\n"));
    assert!(
        outcome
            .stderr
            .contains("grew the pool by 2 Machine(s) from snapshot vs_N3wG0ld3n5nap")
    );
}

#[test]
fn grow_failing_at_a_clone_keeps_the_volume_and_says_how_to_resume() {
    let mut s = Scenario::new();
    grow_start(&mut s);
    s.fail(
        &format!("machine clone {TEMPLATE} -a {APP} --region ams --attach-volume {NEW_VOL}:/data"),
        "Error: could not reserve resource for machine: insufficient memory available to fulfill request",
    );
    let outcome = s.run_all(&["grow", "2"]);
    assert_failed(
        &outcome,
        "grow",
        &[
            "insufficient memory available",
            &format!("grew 1 of 2 ({M1})"),
            &format!(
                "at 'machine clone': volume {NEW_VOL} exists, unattached: the next grow reuses it"
            ),
            "resume with: provision-pool grow 1",
        ],
    );
    assert_eq!(outcome.stdout, "");
}

#[test]
fn grow_without_a_golden_snapshot_asks_for_a_bake() {
    let mut s = Scenario::new();
    s.ok(
        &format!("volumes list -a {APP} --json"),
        list(&[volume(TEMPLATE_VOL, "cr_data", Some(TEMPLATE))]),
    );
    let outcome = s.run_all(&["grow", "3"]);
    assert_failed(
        &outcome,
        "grow",
        &["no golden volume (cr_golden): run provision-pool bake first"],
    );
}

#[test]
fn an_answer_in_an_unexpected_shape_stops_the_command_with_a_clear_error() {
    let mut s = Scenario::new();
    s.ok(
        &format!("volumes list -a {APP} --json"),
        "{\"error\": \"not found\"}\n",
    );
    let outcome = s.run_all(&["grow", "1"]);
    assert_failed(
        &outcome,
        "grow",
        &["volumes list --json answered dict, not a list of objects"],
    );

    let mut s = Scenario::new();
    s.ok(
        &format!("machine list -a {APP} --json"),
        "Error: not logged in\n",
    );
    let outcome = s.run_all(&["status"]);
    assert_failed(
        &outcome,
        "status",
        &[&format!(
            "'machine list -a {APP} --json' did not answer JSON"
        )],
    );
}
