//! Both linearizability checks on simulated Jepsen histories that are
//! linearizable by construction (`register::simulated`): the memoized
//! search with its replayed order, as `History::check` runs it, and
//! `consistency_model`'s checker alone. The latter runs in a child
//! process killed at the limit, so that a search still going on takes no
//! CPU from the next history's.
//!
//! `cargo run --release -p tablix-testkit --example checkers -- [HISTORIES] [LIMIT_SECONDS]`
//! (default 60 histories, 10 s for consistency_model on each).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tablix_testkit::register::simulated;

fn seed_of(n: u64) -> u64 {
    n.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, n] = args.as_slice()
        && flag == "--consistency-model-alone"
    {
        let n: u64 = n.parse().expect("a history number");
        let verdict = simulated(seed_of(n)).consistency_model_alone(Duration::MAX);
        println!("{verdict:?}");
        return;
    }
    let histories: u64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(60);
    let limit = Duration::from_secs(args.get(1).and_then(|a| a.parse().ok()).unwrap_or(10));
    let me = std::env::current_exe().expect("this program's path");
    let (mut slowest, mut timed_out) = (Duration::ZERO, 0);
    for n in 1..=histories {
        let seed = seed_of(n);
        let checked = match simulated(seed).check(Duration::from_secs(600), seed, 0) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("history {n}: {e}");
                std::process::exit(1);
            }
        };
        slowest = slowest.max(checked.took);
        let started = Instant::now();
        let mut child = Command::new(&me)
            .args(["--consistency-model-alone", &n.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .expect("running this program again");
        let verdict = loop {
            if let Some(status) = child.try_wait().expect("waiting for the child") {
                let mut out = String::new();
                if let Some(mut o) = child.stdout.take() {
                    let _ = std::io::Read::read_to_string(&mut o, &mut out);
                }
                break format!("{} ({status}) in {:?}", out.trim(), started.elapsed());
            }
            if started.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                timed_out += 1;
                break format!("no verdict within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        println!(
            "history {n}: {} operations; {} in {:?}; consistency_model alone: {verdict}",
            checked.invoked, checked.by, checked.took
        );
    }
    println!(
        "{histories} histories: the check's slowest took {slowest:?}; consistency_model alone gave no verdict within {limit:?} on {timed_out}"
    );
}
