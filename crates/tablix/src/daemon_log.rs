//! The daemon's log on standard error: `TABLIX_LOG` (an `EnvFilter`,
//! `info` by default), with what its libraries say of normal events kept
//! out of it.

use tracing::field::{Field, Visit};
use tracing::{Event, Metadata};
use tracing_log::NormalizeEvent;
use tracing_subscriber::layer::{Context, Filter, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Where fuser logs a reply the kernel did not take.
const REPLY_TARGET: &str = "fuser::reply";

/// Whether fuser's `message` at `target` says the kernel refused a reply
/// with ENOENT: the kernel no longer knew the request, because it was
/// interrupted (its program was killed or took a signal mid-call). That
/// is an ordinary event, which fuser logs as an error; any other failure
/// to reply is one.
pub(crate) fn is_interrupted_reply(target: &str, message: &str) -> bool {
    target == REPLY_TARGET
        && message.starts_with("Failed to send FUSE reply")
        && message.ends_with("(os error 2)")
}

/// The `message` field of an event.
#[derive(Default)]
struct Message(String);

impl Visit for Message {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            value.clone_into(&mut self.0);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

/// Keeps interrupted replies ([`is_interrupted_reply`]) out of the log.
struct InterruptedReplies;

impl<S> Filter<S> for InterruptedReplies {
    fn enabled(&self, _: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        true
    }

    fn event_enabled(&self, event: &Event<'_>, _: &Context<'_, S>) -> bool {
        // fuser logs through the `log` crate: its events arrive under
        // tracing-log's own target, the record's in their fields.
        let normalized = event.normalized_metadata();
        let target = normalized
            .as_ref()
            .map_or_else(|| event.metadata().target(), |m| m.target());
        if target != REPLY_TARGET {
            return true;
        }
        let mut message = Message::default();
        event.record(&mut message);
        !is_interrupted_reply(target, &message.0)
    }
}

/// The filter `TABLIX_LOG` (or `chosen`'s absence) asks for, quieter where
/// libraries narrate what an operator does not need.
fn env_filter(chosen: Option<String>) -> EnvFilter {
    let chosen = chosen
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| "info".into());
    let mut filter = EnvFilter::try_new(&chosen).unwrap_or_else(|_| EnvFilter::new("info"));
    // fuser warns when the mount it leaves was already gone (someone ran
    // umount): expected, not news, unless asked for.
    if !chosen.contains("fuser")
        && let Ok(quiet) = "fuser::mnt=error".parse()
    {
        filter = filter.add_directive(quiet);
    }
    // openraft narrates every vote and membership step at info; its
    // warnings and errors are what an operator needs. A level quieter
    // than warn already covers it.
    let verbose = filter
        .max_level_hint()
        .is_none_or(|l| l > tracing_subscriber::filter::LevelFilter::WARN);
    if verbose
        && !chosen.contains("openraft")
        && let Ok(quiet) = "openraft=warn".parse()
    {
        filter = filter.add_directive(quiet);
    }
    filter
}

/// Installs the daemon's log; `log` records (fuser's) are taken in too.
pub(crate) fn init() {
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(InterruptedReplies);
    tracing_subscriber::registry()
        .with(env_filter(std::env::var("TABLIX_LOG").ok()))
        .with(layer)
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn only_a_reply_the_kernel_refused_as_unknown_is_an_interrupted_one() {
        let gone = "Failed to send FUSE reply: No such file or directory (os error 2)";
        assert!(is_interrupted_reply(REPLY_TARGET, gone));
        assert!(!is_interrupted_reply("fuser::request", gone));
        for other in [
            "Failed to send FUSE reply: Invalid argument (os error 22)",
            "Failed to send FUSE reply: No such device (os error 19)",
            "Failed to send FUSE reply: whatever (os error 21)",
            "Something else (os error 2)",
        ] {
            assert!(!is_interrupted_reply(REPLY_TARGET, other), "{other}");
        }
    }

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn fusers_interrupted_replies_stay_out_of_the_log_and_its_other_errors_do_not() {
        let _ = tracing_log::LogTracer::init();
        let out = Captured::default();
        let sink = out.clone();
        let subscriber = tracing_subscriber::registry().with(env_filter(None)).with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(move || sink.clone())
                .with_filter(InterruptedReplies),
        );
        tracing::subscriber::with_default(subscriber, || {
            // As fuser logs: through the `log` crate.
            log::error!(target: REPLY_TARGET, "Failed to send FUSE reply: No such file or directory (os error 2)");
            log::error!(target: REPLY_TARGET, "Failed to send FUSE reply: Invalid argument (os error 22)");
            log::error!(target: "fuser::request", "Failed to send FUSE reply: No such file or directory (os error 2)");
            tracing::error!(target: REPLY_TARGET, "Failed to send FUSE reply: No such file or directory (os error 2)");
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert!(
            !text.contains("fuser::reply: Failed to send FUSE reply: No such file"),
            "{text}"
        );
        assert!(text.contains("os error 22"), "{text}");
        assert!(text.contains("fuser::request"), "{text}");
        assert_eq!(text.lines().count(), 2, "{text}");
    }
}
