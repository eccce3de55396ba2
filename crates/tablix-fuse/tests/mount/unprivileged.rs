//! The POSIX suite again, as an unprivileged user with a supplementary
//! group, on a mount made by root with allow_other; plus the permission
//! checks that only a user without root's capabilities can see.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use tablix_store::Durability;

use crate::harness::{SHARED_MOUNT_ENV, mount, require_fuse};

/// Where root leaves files for the permission checks of the other user.
pub const FIXTURES_ENV: &str = "TABLIX_TEST_FIXTURES";
pub const USER: u32 = 65534;
/// A supplementary group of the unprivileged run.
pub const EXTRA_GROUP: u32 = 4242;

fn chown(p: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::chown(p, Some(uid), Some(gid)).expect("chown");
}

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).expect("chmod");
}

/// Files owned by root that the unprivileged user may or may not touch.
pub fn prepare_fixtures(dir: &Path) {
    fs::create_dir(dir).expect("fixtures dir");
    chmod(dir, 0o1777);
    fs::write(dir.join("private"), b"secret").expect("private");
    chmod(&dir.join("private"), 0o600);
    fs::write(dir.join("group-readable"), b"for the group").expect("group file");
    chown(&dir.join("group-readable"), 0, EXTRA_GROUP);
    chmod(&dir.join("group-readable"), 0o640);
    fs::create_dir(dir.join("closed-dir")).expect("closed dir");
    chmod(&dir.join("closed-dir"), 0o755);
    fs::write(dir.join("sticky-victim"), b"root's").expect("victim");
    chmod(&dir.join("sticky-victim"), 0o666);
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn posix_suite_as_an_unprivileged_user() {
    require_fuse("posix_suite_as_an_unprivileged_user");
    let f = mount(Durability::Sync);
    let shared = f.path("shared");
    fs::create_dir(&shared).expect("shared dir");
    chmod(&shared, 0o1777);
    let fixtures = f.path("fixtures");
    prepare_fixtures(&fixtures);
    // A copy of this test binary any user can execute.
    let bin_dir = tempfile::tempdir().expect("tempdir");
    chmod(bin_dir.path(), 0o755);
    let exe = bin_dir.path().join("mount-tests");
    fs::copy(std::env::current_exe().expect("current exe"), &exe).expect("copy test binary");
    chmod(&exe, 0o755);
    let out = Command::new("setpriv")
        .arg(format!("--reuid={USER}"))
        .arg(format!("--regid={USER}"))
        .arg(format!("--groups={USER},{EXTRA_GROUP}"))
        .arg("--")
        .arg(&exe)
        .arg("posix::")
        .arg("--include-ignored")
        // A full or small disk needs a tmpfs mounted by root: those tests
        // are root's.
        .args(["--skip", "full_disk", "--skip", "fallocate_asks_for_room"])
        .arg("--test-threads=2")
        .env(SHARED_MOUNT_ENV, &shared)
        .env(FIXTURES_ENV, &fixtures)
        .env_remove("CI")
        .output()
        .expect("setpriv (util-linux) runs the suite as another user");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the POSIX suite failed as uid {USER}:\n{stdout}\n{stderr}"
    );
    let passed = stdout
        .lines()
        .filter(|l| l.starts_with("test posix::") && l.ends_with("... ok"))
        .count();
    assert!(passed >= 17, "too few tests ran as uid {USER}:\n{stdout}");
    // The files the suite made there belong to that user.
    let owner = fs::read_dir(&shared)
        .expect("shared")
        .filter_map(|e| e.ok())
        .map(|e| std::os::unix::fs::MetadataExt::uid(&e.metadata().expect("meta")))
        .collect::<Vec<_>>();
    assert!(!owner.is_empty() && owner.iter().all(|&u| u == USER));
}
