//! A small tmpfs mounted for the length of a test: a disk that fills up.

use std::path::Path;
use std::process::Command;

/// A tmpfs of a given size on a temporary directory, unmounted (lazily, in
/// case a test's daemon still holds it) when dropped. Mounting needs root.
pub struct TinyDisk {
    dir: tempfile::TempDir,
}

impl TinyDisk {
    /// Mounts a tmpfs of `size` (as mount(8) takes it: `3m`, `900k`) for
    /// `test`; fails the test without root.
    pub fn mount(test: &str, size: &str) -> TinyDisk {
        crate::require::root(test, "mount a tmpfs");
        let dir = tempfile::tempdir().expect("a temporary directory");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tablix-test"])
            .arg(dir.path())
            .status()
            .expect("running mount");
        assert!(status.success(), "mounting a {size} tmpfs failed");
        TinyDisk { dir }
    }

    /// Gives the tmpfs a new size (a disk that was full gets room).
    pub fn resize(&self, size: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(self.dir.path())
            .status()
            .expect("running mount");
        assert!(status.success(), "resizing the tmpfs to {size} failed");
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for TinyDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}
