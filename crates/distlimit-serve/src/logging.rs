//! The logging of a shipped binary (feature `logging`, [`init`]), throttled so that a failure
//! repeated on every request (a fail-closed store answering thousands of requests a second)
//! writes a few lines and a count, not one per request.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::callsite::Identifier;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;

/// How many WARN and ERROR events one call site writes per [`THROTTLE_WINDOW`]; the rest are
/// counted and reported in one line when the site next writes.
pub const THROTTLE_BURST: u32 = 5;

/// The window of [`THROTTLE_BURST`].
pub const THROTTLE_WINDOW: Duration = Duration::from_secs(10);

/// The target of the lines counting suppressed events.
const THROTTLE_TARGET: &str = "distlimit_serve::logging";

/// The target of the file poller's events ([`poll_files`](crate::poll_files)): its ERROR
/// events, the refused configurations, are never throttled. The poller logs each distinct
/// refusal once already, and each is the only reason an operator fixing a file gets.
const POLLER_TARGET: &str = "distlimit_policy::reload";

/// Installs the global subscriber: text lines on stderr; the filter from `RUST_LOG`, else
/// `LOG_LEVEL` (envoyproxy/ratelimit's: `debug`, `info`, `warn`, `error`, any case), else
/// `info`; WARN and ERROR events throttled per call site ([`Throttle`]). Does nothing if a
/// global subscriber is already set.
pub fn init() {
    let set = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let wanted = set("RUST_LOG").or_else(|| set("LOG_LEVEL").map(|v| v.to_ascii_lowercase()));
    let (filter, refused) = match wanted.as_deref().map(EnvFilter::try_new) {
        None => (EnvFilter::new("info"), None),
        Some(Ok(filter)) => (filter, None),
        Some(Err(error)) => (EnvFilter::new("info"), Some(error)),
    };
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(Throttle::new(THROTTLE_BURST, THROTTLE_WINDOW))
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .try_init();
    if let Some(error) = refused {
        tracing::warn!("RUST_LOG/LOG_LEVEL refused ({error}): logging at info");
    }
}

/// A layer that lets each call site write at most `burst` WARN and ERROR events per `window`;
/// the events beyond are dropped and counted, and the first event of the site in a later
/// window is preceded by one WARN line saying how many were not written. INFO and lower pass
/// untouched, without a lock.
#[derive(Debug)]
pub struct Throttle {
    burst: u32,
    window: Duration,
    sites: Mutex<HashMap<Identifier, Site>>,
}

#[derive(Debug)]
struct Site {
    window_start: Instant,
    written: u32,
    suppressed: u64,
}

impl Throttle {
    /// At most `burst` events per call site per `window`.
    pub fn new(burst: u32, window: Duration) -> Self {
        Self {
            burst,
            window,
            sites: Mutex::new(HashMap::new()),
        }
    }

    /// Whether the event of `site` is written now, and how many events of the site were
    /// dropped in the window that just ended (to report first).
    fn admit(&self, site: Identifier, now: Instant) -> (bool, u64) {
        let Ok(mut sites) = self.sites.lock() else {
            return (true, 0);
        };
        let site = sites.entry(site).or_insert(Site {
            window_start: now,
            written: 0,
            suppressed: 0,
        });
        if now.duration_since(site.window_start) >= self.window {
            let suppressed = std::mem::take(&mut site.suppressed);
            site.window_start = now;
            site.written = 1;
            return (true, suppressed);
        }
        if site.written < self.burst {
            site.written += 1;
            (true, 0)
        } else {
            site.suppressed += 1;
            (false, 0)
        }
    }
}

impl<S: Subscriber> Layer<S> for Throttle {
    fn event_enabled(&self, event: &Event<'_>, _: Context<'_, S>) -> bool {
        let meta = event.metadata();
        // More verbose levels compare greater: INFO, DEBUG and TRACE pass.
        if *meta.level() > Level::WARN
            || meta.target() == THROTTLE_TARGET
            || (*meta.level() == Level::ERROR && meta.target() == POLLER_TARGET)
        {
            return true;
        }
        let (write, suppressed) = self.admit(meta.callsite(), Instant::now());
        if suppressed > 0 {
            tracing::warn!(
                target: THROTTLE_TARGET,
                "{suppressed} more like the next line were not logged in the last {:?} \
                 (at most {} per {:?} from {}:{})",
                self.window,
                self.burst,
                self.window,
                meta.file().unwrap_or("?"),
                meta.line().unwrap_or(0),
            );
        }
        write
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    struct Here;
    static HERE: Here = Here;
    impl tracing::Callsite for Here {
        fn set_interest(&self, _: tracing::subscriber::Interest) {}
        fn metadata(&self) -> &tracing::Metadata<'_> {
            unimplemented!()
        }
    }

    #[test]
    fn a_site_writes_its_burst_per_window_then_reports_the_rest() {
        let throttle = Throttle::new(3, Duration::from_secs(10));
        let start = Instant::now();
        let at = |ms| throttle.admit(Identifier(&HERE), start + Duration::from_millis(ms));
        let written: Vec<bool> = (0..100).map(|i| at(i).0).collect();
        assert_eq!(written.iter().filter(|w| **w).count(), 3);
        assert!(written[..3].iter().all(|w| *w));
        // The next window: written, and the 97 dropped are reported.
        assert_eq!(at(11_000), (true, 97));
        assert_eq!(at(12_000), (true, 0));
    }
}
