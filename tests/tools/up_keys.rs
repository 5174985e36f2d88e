//! The two keys `scripts/up` creates the first time (`scripts/lib/keys.sh`):
//! one for programs and one, with the admin scope, for the operator; both
//! kept on a rerun, and the missing one added to an older install.

use crate::common;

use std::os::unix::fs::PermissionsExt;

use common::up_keys::{ensure_keys, read_key};

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path)
        .expect("exists")
        .permissions()
        .mode()
        & 0o777
}

#[test]
fn a_new_install_gets_a_program_key_and_an_admin_key_and_a_rerun_keeps_both() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join(".code-runner");
    let (said, setting) = ensure_keys(&state);
    let key = read_key(&state, "api-key");
    let admin = read_key(&state, "admin-key");
    assert_eq!(
        said,
        format!(
            "up: generated a new API key for programs in {0}/api-key\n\
             up: generated a new admin key for the operator in {0}/admin-key\n",
            state.display()
        )
    );
    for k in [&key, &admin] {
        assert_eq!(k.len(), 64, "{k:?}");
        assert!(k.bytes().all(|b| b.is_ascii_hexdigit()), "{k:?}");
    }
    assert_ne!(key, admin);
    assert_eq!(setting, format!("local:{key},operator:{admin}:admin"));
    assert_eq!(mode(&state), 0o700);
    assert_eq!(mode(&state.join("api-key")), 0o600);
    assert_eq!(mode(&state.join("admin-key")), 0o600);
    // The setting parses as the server parses CODE_RUNNER_API_KEYS: the
    // operator's key has the admin scope, the programs' key has not.
    let keys = code_runner::api::ApiKeys::parse(&setting).expect("a valid setting");
    assert!(keys.check(&admin).expect("the admin key").admin);
    assert!(!keys.check(&key).expect("the program key").admin);

    let (said, again) = ensure_keys(&state);
    assert_eq!(
        said,
        format!(
            "up: keeping the API key for programs in {0}/api-key\n\
             up: keeping the admin key for the operator in {0}/admin-key\n",
            state.display()
        )
    );
    assert_eq!(again, setting);
}

#[test]
fn an_install_from_before_the_admin_key_keeps_its_key_and_gains_an_admin_key() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join(".code-runner");
    std::fs::create_dir(&state).unwrap();
    let old = "0123456789abcdef0123456789abcdef";
    std::fs::write(state.join("api-key"), old).unwrap();
    let (said, setting) = ensure_keys(&state);
    assert_eq!(
        said,
        format!(
            "up: keeping the API key for programs in {0}/api-key\n\
             up: generated a new admin key for the operator in {0}/admin-key\n",
            state.display()
        )
    );
    let admin = read_key(&state, "admin-key");
    assert_eq!(setting, format!("local:{old},operator:{admin}:admin"));
}
