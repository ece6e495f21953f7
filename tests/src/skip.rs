//! The one way to skip tests that need a server or a browser: `OUTBOX_SKIP_SERVER_TESTS=1`
//! (a laptop without PostgreSQL, MariaDB or Chromium). Each skip is counted, and the count is
//! written to stderr when the test binary exits. Without it such a test fails when what it
//! needs is missing.

use std::io::Write as _;
use std::sync::Once;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The variable that skips the server-backed and browser tests.
pub const SKIP_VAR: &str = "OUTBOX_SKIP_SERVER_TESTS";

static SKIPPED: AtomicUsize = AtomicUsize::new(0);
static SAY_AT_EXIT: Once = Once::new();

/// Whether tests needing `what` are skipped; when they are, counts this one.
pub fn skipping(what: &str) -> bool {
    if std::env::var(SKIP_VAR).as_deref() != Ok("1") {
        return false;
    }
    let n = SKIPPED.fetch_add(1, Ordering::Relaxed) + 1;
    if n == 1 {
        let _ =
            writeln!(std::io::stderr(), "note: {SKIP_VAR}=1: skipping the tests that need {what} (counted at exit)");
    }
    SAY_AT_EXIT.call_once(|| {
        // SAFETY: `say_skipped` is a plain function that only writes to stderr.
        #[allow(unsafe_code)]
        unsafe {
            libc::atexit(say_skipped);
        }
    });
    true
}

extern "C" fn say_skipped() {
    let n = SKIPPED.load(Ordering::Relaxed);
    let _ = writeln!(std::io::stderr(), "note: {n} test(s) skipped because {SKIP_VAR}=1");
}
