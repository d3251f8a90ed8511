//! The binary's start-up refusals for the admin API's settings: each exits 64 (EX_USAGE)
//! with a message naming the setting, before binding or connecting anything.

use std::process::Command;

/// Runs the binary with `args` and `token` as `SWITCHYARD_ADMIN_TOKEN` (none if `None`);
/// returns its stderr after checking it exited 64.
fn refused(args: &[&str], token: Option<&str>) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_switchyard-control-plane"));
    command
        .args(args)
        .env_remove("SWITCHYARD_ADMIN_TOKEN")
        .env_remove("SWITCHYARD_ADMIN_TOKEN_FILE");
    if let Some(token) = token {
        command.env("SWITCHYARD_ADMIN_TOKEN", token);
    }
    let output = command.output().expect("the binary runs");
    assert_eq!(output.status.code(), Some(64), "{output:?}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn bad_admin_settings_exit_64_naming_the_setting() {
    let same = refused(
        &[
            "--listen",
            "127.0.0.1:18090",
            "--admin-listen",
            "127.0.0.1:18090",
        ],
        Some("a-long-enough-admin-token"),
    );
    assert!(
        same.contains("--admin-listen must differ from --listen"),
        "{same}"
    );

    let short = refused(&[], Some("short"));
    assert!(short.contains("SWITCHYARD_ADMIN_TOKEN"), "{short}");
    assert!(short.contains("at least 16"), "{short}");

    let missing = refused(&["--admin-token-file", "/nonexistent/admin-token"], None);
    assert!(
        missing.contains("--admin-token-file /nonexistent/admin-token"),
        "{missing}"
    );
}
