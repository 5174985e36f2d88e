//! `provision-pool shrink`: the stopped Machines of the highest ids
//! destroyed with their volumes, never a started one nor the last one, and
//! a volume that fails to go.

use super::*;

#[test]
fn shrink_destroys_the_highest_id_stopped_machines_and_their_volumes() {
    let mut s = Scenario::new();
    s.ok(&format!("machine list -a {APP} --json"), four_machines())
        .ok(
            &format!("machine destroy {M3} -a {APP}"),
            format!("{M3} has been destroyed\n"),
        )
        .ok(
            &format!("volumes destroy {M3_VOL} -a {APP} -y"),
            format!("Destroyed volume ID: {M3_VOL} name: cr_data\n"),
        )
        .ok(&format!("machine destroy {M2} -a {APP}"), "")
        .ok(&format!("volumes destroy {NEW_VOL} -a {APP} -y"), "");
    let outcome = s.run_all(&["shrink", "2"]);
    assert_eq!(outcome.code, Some(0), "stderr:\n{}", outcome.stderr);
    assert_eq!(outcome.stdout, format!("{M3}\n{M2}\n"));
}

#[test]
fn shrink_never_touches_a_started_machine_nor_the_last_one() {
    let mut s = Scenario::new();
    s.ok(&format!("machine list -a {APP} --json"), four_machines());
    let outcome = s.run_all(&["shrink", "4"]);
    assert_failed(
        &outcome,
        "shrink",
        &["the pool has 4 Machines; shrinking by 4 would leave none to clone"],
    );

    let mut s = Scenario::new();
    s.ok(
        &format!("machine list -a {APP} --json"),
        list(&[
            machine(TEMPLATE, "started", TEMPLATE_VOL),
            machine(M1, "started", SPARE_VOL),
            machine(M2, "stopped", NEW_VOL),
        ]),
    );
    let outcome = s.run_all(&["shrink", "2"]);
    assert_failed(
        &outcome,
        "shrink",
        &["only 1 of the pool's 3 Machines are stopped; a started one may run jobs"],
    );
}

#[test]
fn shrink_failing_at_a_volume_says_which_volume_is_left_and_how_to_resume() {
    let mut s = Scenario::new();
    s.ok(&format!("machine list -a {APP} --json"), four_machines())
        .ok(&format!("machine destroy {M3} -a {APP}"), "")
        .fail(
            &format!("volumes destroy {M3_VOL} -a {APP} -y"),
            "Error: volume is still attached",
        );
    let outcome = s.run_all(&["shrink", "2"]);
    assert_failed(
        &outcome,
        "shrink",
        &[&format!(
            "Machine {M3} is destroyed but its volume {M3_VOL} remains: flyctl volumes destroy {M3_VOL} -a {APP} -y, then provision-pool shrink 1"
        )],
    );
}
