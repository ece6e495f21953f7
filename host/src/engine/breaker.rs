//! The circuit breaker of one sink, as a pure state machine over outcomes and the clock.
//!
//! - **Closed** (normal): deliveries start freely. `failures` retryable failures or
//!   timeouts in a row, or one push-back for the whole destination, open it.
//! - **Open**: nothing starts and nothing is claimed for the cool-down; the rows waiting are
//!   not attempted, so their `retry_count` does not grow. The first cool-down is
//!   `cool_down`; it doubles each time a probe fails, up to `max_cool_down`. A `throttled`
//!   push-back with a `retry-after` waits exactly that instead.
//! - **Half-open**: once the cool-down has passed, one probe delivery starts. If the
//!   destination answers (delivered, skipped, or a permanent failure about the event), the
//!   breaker closes and the cool-down starts over; if it fails again, the breaker reopens.
//!
//! - **Seen back**: when the sink said the destination is unavailable, and the sink can
//!   tell on its own that it is reachable again (a relay probes its broker every 2 s), an
//!   answer after the breaker opened ends the cool-down: the probe delivery starts then, not
//!   up to `max_cool_down` later. Failures in a row, a wait the sink asked for
//!   (`retry-after`) and a config mistake are not cut short: a reachable destination does
//!   not mend them.
//!
//! - **Misconfigured**: an attempt failed after the sink's own egress policy refused one of
//!   its requests (`allowed_hosts`, `allow_http`): a config mistake, which no retry fixes
//!   and which must not consume the events. Like open, nothing starts and the waiting rows
//!   keep their attempts; probes follow the same growing cool-down, and readiness says so
//!   until a probe gets past the policy.
//!
//! Traps, envelopes that do not decode and room-scoped push-backs say nothing about the
//! destination and leave the breaker as it is. The breaker is per host: each host learns
//! of an outage from its own attempts (a handful each, see the README).

use std::time::{Duration, Instant};

/// Default `sink.breaker.failures`.
pub const DEFAULT_FAILURES: u32 = 5;
/// Default `sink.breaker.cool_down`.
pub const DEFAULT_COOL_DOWN: Duration = Duration::from_secs(1);
/// Default `sink.breaker.max_cool_down`.
pub const DEFAULT_MAX_COOL_DOWN: Duration = Duration::from_secs(60);

/// `sink.breaker:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerSettings {
    /// Retryable failures or timeouts in a row that open the breaker; 0: only a push-back
    /// opens it.
    pub failures: u32,
    /// The first cool-down.
    pub cool_down: Duration,
    /// The longest cool-down.
    pub max_cool_down: Duration,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        BreakerSettings {
            failures: DEFAULT_FAILURES,
            cool_down: DEFAULT_COOL_DOWN,
            max_cool_down: DEFAULT_MAX_COOL_DOWN,
        }
    }
}

/// A probe time past any the clock can hold is taken as this far off.
const FAR_FUTURE: Duration = Duration::from_secs(86_400);

/// Where the breaker is (kept with the metrics that show it, which the page reads too).
pub use crate::ops::metrics::SinkState as State;

/// What one finished delivery says about the destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It answered: delivered, skipped, or failed permanently for this event.
    Answered,
    /// A retryable failure or a timeout.
    Failed,
    /// The sink pushed back for the whole destination (`throttled` or `unavailable`).
    PushedBack {
        /// `throttled` (else `unavailable`).
        throttled: bool,
        /// The sink's hint (already clamped to `sink.max_retry_after`).
        retry_after: Option<Duration>,
    },
    /// Nothing about the destination: a trap, an envelope that does not decode, a room's
    /// frequency limit.
    Neutral,
    /// The sink's egress policy refused a request of the failed attempt: its config is wrong.
    Misconfigured {
        /// What the policy refused, naming the key to change.
        reason: String,
    },
}

/// What may start now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Any number of deliveries.
    Any,
    /// One probe (the caller starts it and reports it with `probe: true`).
    Probe,
    /// Nothing.
    Nothing,
}

/// A change of state, for the log and the metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// The new state.
    pub to: State,
    /// For `open`: how long until the next probe.
    pub cool_down: Option<Duration>,
    /// Why, in a few words.
    pub reason: String,
}

/// The breaker of one sink.
#[derive(Debug)]
pub struct Breaker {
    settings: BreakerSettings,
    state: State,
    failures_in_a_row: u32,
    /// While open: when the probe may start.
    reopens_at: Option<Instant>,
    /// While open because the sink said the destination is unavailable (with no wait of its
    /// own): when it opened.
    unavailable_since: Option<Instant>,
    /// The cool-down of the next opening that is not a throttle with a hint.
    next_cool_down: Duration,
    /// While half-open: whether the probe is under way.
    probing: bool,
}

impl Breaker {
    /// A closed breaker.
    pub fn new(settings: BreakerSettings) -> Breaker {
        Breaker {
            settings,
            state: State::Closed,
            failures_in_a_row: 0,
            reopens_at: None,
            unavailable_since: None,
            next_cool_down: settings.cool_down,
            probing: false,
        }
    }

    /// Where it is.
    pub fn state(&self) -> State {
        self.state
    }

    /// While open, when the probe may start.
    pub fn reopens_at(&self) -> Option<Instant> {
        self.reopens_at
    }

    /// While open because the sink said the destination is unavailable: since when, for
    /// [`Breaker::seen_back`].
    pub fn unavailable_since(&self) -> Option<Instant> {
        if self.state == State::Open { self.unavailable_since } else { None }
    }

    /// The destination answered after it was found unavailable: open → half-open now, the
    /// cool-down cut short.
    pub fn seen_back(&mut self, now: Instant) -> Option<Transition> {
        self.unavailable_since()?;
        self.reopens_at = Some(now);
        let mut moved = self.poll(now)?;
        moved.reason = "the destination answers again; one probe".into();
        Some(moved)
    }

    /// Open (or misconfigured) → half-open once the cool-down has passed.
    pub fn poll(&mut self, now: Instant) -> Option<Transition> {
        match (self.state, self.reopens_at) {
            (State::Open | State::Misconfigured, Some(at)) if now >= at => {
                self.state = State::HalfOpen;
                self.reopens_at = None;
                self.probing = false;
                Some(Transition { to: State::HalfOpen, cool_down: None, reason: "cool-down over; one probe".into() })
            }
            _ => None,
        }
    }

    /// What may start now (after [`Breaker::poll`]). A `Probe` answer counts the probe as
    /// started.
    pub fn admit(&mut self) -> Admit {
        match self.state {
            State::Closed => Admit::Any,
            State::HalfOpen if !self.probing => {
                self.probing = true;
                Admit::Probe
            }
            State::HalfOpen | State::Open | State::Misconfigured => Admit::Nothing,
        }
    }

    /// A started probe was not run after all (its row was handed back): another may start.
    pub fn probe_not_run(&mut self) {
        if self.state == State::HalfOpen {
            self.probing = false;
        }
    }

    /// Takes in a finished delivery: `probe` when it was the half-open probe. Deliveries
    /// that were under way when the breaker opened change nothing while it is open.
    pub fn record(&mut self, verdict: &Verdict, probe: bool, now: Instant) -> Option<Transition> {
        match self.state {
            State::Closed => match verdict {
                Verdict::Answered => {
                    self.failures_in_a_row = 0;
                    None
                }
                Verdict::Failed => {
                    self.failures_in_a_row = self.failures_in_a_row.saturating_add(1);
                    let threshold = self.settings.failures;
                    (threshold > 0 && self.failures_in_a_row >= threshold)
                        .then(|| self.open(now, None, format!("{threshold} retryable failures or timeouts in a row")))
                }
                Verdict::PushedBack { throttled, retry_after } => Some(self.pushed_back(*throttled, *retry_after, now)),
                Verdict::Misconfigured { reason } => Some(self.misconfigured(now, reason)),
                Verdict::Neutral => None,
            },
            State::HalfOpen if probe => {
                self.probing = false;
                match verdict {
                    Verdict::Answered => {
                        self.state = State::Closed;
                        self.failures_in_a_row = 0;
                        self.next_cool_down = self.settings.cool_down;
                        Some(Transition { to: State::Closed, cool_down: None, reason: "the probe got through".into() })
                    }
                    Verdict::Failed => Some(self.open(now, None, "the probe failed".into())),
                    Verdict::PushedBack { throttled, retry_after } => {
                        Some(self.pushed_back(*throttled, *retry_after, now))
                    }
                    Verdict::Misconfigured { reason } => Some(self.misconfigured(now, reason)),
                    Verdict::Neutral => None,
                }
            }
            State::HalfOpen | State::Open | State::Misconfigured => None,
        }
    }

    fn pushed_back(&mut self, throttled: bool, retry_after: Option<Duration>, now: Instant) -> Transition {
        if throttled {
            let reason = "the sink says the destination is throttled".to_string();
            self.open(now, retry_after, reason)
        } else {
            let reason = "the sink says the destination is unavailable".to_string();
            let at_least = retry_after.map(|hint| hint.max(self.next_cool_down));
            let moved = self.open(now, at_least, reason);
            self.unavailable_since = retry_after.is_none().then_some(now);
            moved
        }
    }

    /// Pauses for the growing cool-down, as misconfigured.
    fn misconfigured(&mut self, now: Instant, reason: &str) -> Transition {
        let mut moved = self.open(now, None, reason.to_string());
        self.state = State::Misconfigured;
        moved.to = State::Misconfigured;
        moved
    }

    /// Opens for `exactly` (a hint), else for the growing cool-down.
    fn open(&mut self, now: Instant, exactly: Option<Duration>, reason: String) -> Transition {
        let cool_down = exactly.unwrap_or(self.next_cool_down);
        if exactly.is_none() {
            self.next_cool_down = self.next_cool_down.saturating_mul(2).min(self.settings.max_cool_down);
        }
        self.state = State::Open;
        // An absurd cool-down (a huge config value or hint) must not overflow the clock:
        // a day stands in for "for ever" then.
        self.reopens_at = Some(now.checked_add(cool_down).unwrap_or(now + FAR_FUTURE));
        self.unavailable_since = None;
        self.probing = false;
        self.failures_in_a_row = 0;
        Transition { to: State::Open, cool_down: Some(cool_down), reason }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn breaker(failures: u32) -> Breaker {
        Breaker::new(BreakerSettings { failures, cool_down: S, max_cool_down: 8 * S })
    }

    fn throttled(retry_after: Option<Duration>) -> Verdict {
        Verdict::PushedBack { throttled: true, retry_after }
    }

    fn unavailable(retry_after: Option<Duration>) -> Verdict {
        Verdict::PushedBack { throttled: false, retry_after }
    }

    #[test]
    fn failures_in_a_row_open_it_and_an_answer_in_between_starts_the_count_over() {
        let (mut b, t0) = (breaker(3), Instant::now());
        for verdict in [Verdict::Failed, Verdict::Failed, Verdict::Answered, Verdict::Failed, Verdict::Neutral] {
            assert_eq!(b.record(&verdict, false, t0), None);
        }
        assert_eq!(b.record(&Verdict::Failed, false, t0), None);
        let opened = b.record(&Verdict::Failed, false, t0).expect("the third failure in a row opens it");
        assert_eq!((opened.to, opened.cool_down), (State::Open, Some(S)));
        assert_eq!((b.state(), b.admit(), b.reopens_at()), (State::Open, Admit::Nothing, Some(t0 + S)));
    }

    #[test]
    fn zero_failures_means_only_a_push_back_opens_it() {
        let (mut b, t0) = (breaker(0), Instant::now());
        for _ in 0..1_000 {
            assert_eq!(b.record(&Verdict::Failed, false, t0), None);
        }
        assert_eq!(b.record(&unavailable(None), false, t0).map(|t| t.to), Some(State::Open));
    }

    #[test]
    fn after_the_cool_down_one_probe_starts_and_an_answer_closes_it() {
        let (mut b, t0) = (breaker(1), Instant::now());
        b.record(&Verdict::Failed, false, t0);
        assert_eq!(b.poll(t0 + S / 2), None, "still cooling down");
        assert_eq!(b.admit(), Admit::Nothing);
        assert_eq!(b.poll(t0 + S).map(|t| t.to), Some(State::HalfOpen));
        assert_eq!(b.admit(), Admit::Probe);
        assert_eq!(b.admit(), Admit::Nothing, "one probe at a time");
        assert_eq!(b.record(&Verdict::Failed, false, t0 + S), None, "only the probe's outcome counts");
        let closed = b.record(&Verdict::Answered, true, t0 + S).unwrap();
        assert_eq!((closed.to, b.admit()), (State::Closed, Admit::Any));
    }

    #[test]
    fn a_failed_probe_reopens_it_for_a_cool_down_that_doubles_up_to_the_maximum() {
        let (mut b, mut now) = (breaker(1), Instant::now());
        let mut cool_downs = vec![b.record(&Verdict::Failed, false, now).unwrap().cool_down.unwrap()];
        for _ in 0..5 {
            now = b.reopens_at().unwrap();
            b.poll(now);
            assert_eq!(b.admit(), Admit::Probe);
            cool_downs.push(b.record(&Verdict::Failed, true, now).unwrap().cool_down.unwrap());
        }
        assert_eq!(cool_downs, [S, 2 * S, 4 * S, 8 * S, 8 * S, 8 * S]);
        now = b.reopens_at().unwrap();
        b.poll(now);
        b.admit();
        b.record(&Verdict::Answered, true, now);
        let again = b.record(&Verdict::Failed, false, now).unwrap();
        assert_eq!(again.cool_down, Some(S), "closing starts the cool-down over");
    }

    #[test]
    fn a_throttle_waits_exactly_its_hint_and_does_not_grow_the_cool_down() {
        let (mut b, t0) = (breaker(5), Instant::now());
        let opened = b.record(&throttled(Some(Duration::from_millis(300))), false, t0).unwrap();
        assert_eq!(opened.cool_down, Some(Duration::from_millis(300)));
        b.poll(t0 + Duration::from_millis(300));
        assert_eq!(b.admit(), Admit::Probe);
        let reopened = b.record(&throttled(None), true, t0).unwrap();
        assert_eq!(reopened.cool_down, Some(S), "no hint: the cool-down, which the hint did not grow");
    }

    #[test]
    fn unavailable_waits_at_least_the_cool_down_and_at_least_its_hint() {
        let (mut b, t0) = (breaker(5), Instant::now());
        assert_eq!(b.record(&unavailable(Some(Duration::from_millis(10))), false, t0).unwrap().cool_down, Some(S));
        let mut b = breaker(5);
        assert_eq!(b.record(&unavailable(Some(30 * S)), false, t0).unwrap().cool_down, Some(30 * S));
    }

    #[test]
    fn while_open_late_outcomes_change_nothing_and_a_neutral_probe_lets_another_go() {
        let (mut b, t0) = (breaker(1), Instant::now());
        b.record(&Verdict::Failed, false, t0);
        for verdict in [Verdict::Answered, Verdict::Failed, throttled(Some(100 * S))] {
            assert_eq!(b.record(&verdict, false, t0), None);
        }
        assert_eq!(b.reopens_at(), Some(t0 + S));
        b.poll(t0 + S);
        assert_eq!(b.admit(), Admit::Probe);
        assert_eq!(b.record(&Verdict::Neutral, true, t0 + S), None);
        assert_eq!(b.admit(), Admit::Probe, "a trap says nothing: probe again");
        b.probe_not_run();
        assert_eq!(b.admit(), Admit::Probe, "a probe handed back unrun: probe again");
    }

    #[test]
    fn a_destination_seen_back_ends_an_unavailable_cool_down_and_nothing_else() {
        let (mut b, t0) = (breaker(5), Instant::now());
        assert_eq!(b.unavailable_since(), None, "closed");
        assert_eq!(b.seen_back(t0), None, "closed: nothing to cut short");
        b.record(&unavailable(None), false, t0);
        b.poll(t0 + S);
        b.admit();
        b.record(&unavailable(None), true, t0 + S);
        assert_eq!(b.state(), State::Open);
        assert_eq!(b.unavailable_since(), Some(t0 + S), "reopened by the failed probe");
        assert_eq!(b.reopens_at(), Some(t0 + 3 * S), "the doubled cool-down");
        let moved = b.seen_back(t0 + S + S / 2).expect("open → half-open");
        assert_eq!(moved.to, State::HalfOpen);
        assert_eq!(b.admit(), Admit::Probe);
        assert_eq!(b.unavailable_since(), None, "half-open");
        assert_eq!(b.seen_back(t0 + 2 * S), None, "half-open: the probe is under way");

        let mut failing = breaker(1);
        failing.record(&Verdict::Failed, false, t0);
        assert_eq!(failing.seen_back(t0 + S / 2), None, "failures in a row: the destination answers, and fails");
        let mut hinted = breaker(1);
        hinted.record(&unavailable(Some(30 * S)), false, t0);
        assert_eq!(hinted.seen_back(t0 + S), None, "a wait the sink asked for is kept");
        assert_eq!(hinted.reopens_at(), Some(t0 + 30 * S));
        let mut m = breaker(1);
        m.record(&Verdict::Misconfigured { reason: "allowed_hosts".into() }, false, t0);
        assert_eq!(m.seen_back(t0 + S), None, "a reachable destination does not mend the config");
        assert_eq!(m.state(), State::Misconfigured);
    }

    #[test]
    fn a_config_mistake_pauses_it_as_misconfigured_until_a_probe_gets_past_the_policy() {
        let (mut b, t0) = (breaker(5), Instant::now());
        let denied = Verdict::Misconfigured { reason: "plain http is off for this sink (sink.allow_http)".into() };
        let paused = b.record(&denied, false, t0).expect("one attempt is enough");
        assert_eq!((paused.to, paused.cool_down), (State::Misconfigured, Some(S)));
        assert!(paused.reason.contains("sink.allow_http"), "{}", paused.reason);
        assert_eq!((b.state(), b.admit()), (State::Misconfigured, Admit::Nothing));
        assert_eq!(b.record(&Verdict::Answered, false, t0), None, "late outcomes change nothing");
        assert_eq!(b.poll(t0 + S).map(|t| t.to), Some(State::HalfOpen));
        assert_eq!(b.admit(), Admit::Probe);
        let again = b.record(&denied, true, t0 + S).unwrap();
        assert_eq!((again.to, again.cool_down), (State::Misconfigured, Some(2 * S)), "the cool-down grows");
        b.poll(t0 + 3 * S);
        b.admit();
        assert_eq!(b.record(&Verdict::Answered, true, t0 + 3 * S).map(|t| t.to), Some(State::Closed));
    }

    #[test]
    fn absurd_settings_do_not_overflow_the_clock_or_the_doubling() {
        let huge = Duration::from_secs(u64::MAX / 2);
        let mut b = Breaker::new(BreakerSettings { failures: 1, cool_down: huge, max_cool_down: Duration::MAX });
        let now = Instant::now();
        for _ in 0..5 {
            let opened = b.record(&Verdict::Failed, b.state() == State::HalfOpen, now).unwrap();
            assert_eq!(opened.to, State::Open);
            let at = b.reopens_at().unwrap();
            assert!(at > now);
            b.poll(at);
            assert_eq!(b.admit(), Admit::Probe);
        }
    }

    #[test]
    fn an_absurd_hint_does_not_overflow_the_clock() {
        let (mut b, t0) = (breaker(1), Instant::now());
        let opened = b.record(&throttled(Some(Duration::MAX)), false, t0).unwrap();
        assert_eq!(opened.to, State::Open);
        assert!(b.reopens_at().is_some());
    }
}
