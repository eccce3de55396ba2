//! Builds the `LD_PRELOAD` library of `tablix run` (shim/pipe_preload.c)
//! as a shared object that the binary embeds, and records where the bundled
//! SQLite's source is for the speedtest1 benchmark.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    // The bundled SQLite's source directory (sqlite3.c, sqlite3.h), for
    // `tablix bench pcache --suite speedtest1`.
    if let Some(dir) = std::env::var_os("DEP_SQLITE3_INCLUDE") {
        println!(
            "cargo:rustc-env=TABLIX_SQLITE_SOURCE={}",
            PathBuf::from(dir).display()
        );
    }
    let src = "shim/pipe_preload.c";
    println!("cargo:rerun-if-changed={src}");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"))
        .join("libtablix_preload.so");
    let compiler = cc::Build::new().get_compiler();
    let status = Command::new(compiler.path())
        .args([
            "-shared",
            "-fPIC",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-std=gnu11",
            "-o",
        ])
        .arg(&out)
        .arg(src)
        .arg("-ldl")
        .status()
        .expect("running the C compiler for the preload library");
    assert!(status.success(), "compiling {src} failed");
}
