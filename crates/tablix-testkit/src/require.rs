//! Requirements of tests that the machine must meet. A test that calls one
//! of these is `#[ignore = "needs ..."]`: `cargo test` counts it as
//! ignored, `make test` runs it as root, and without what it needs it
//! fails with the reason instead of passing.

use std::path::Path;

/// Why FUSE tests cannot run here, if they cannot.
pub fn why_no_fuse() -> Option<&'static str> {
    if !Path::new("/dev/fuse").exists() {
        Some("/dev/fuse is missing")
    } else if !is_root() {
        Some("mounting needs root")
    } else {
        None
    }
}

/// Fails `test` unless it can mount FUSE file systems (root and /dev/fuse).
pub fn fuse(test: &str) {
    if let Some(why) = why_no_fuse() {
        panic!("{test} needs FUSE, but {why}: run it as root (make test does)");
    }
}

/// Fails `test` unless it runs as root, which `what` needs.
pub fn root(test: &str, what: &str) {
    if !is_root() {
        panic!("{test} needs root to {what}: run it as root (make test does)");
    }
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}
