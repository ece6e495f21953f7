//! How many rows the next claim asks for. A backlog drains faster in larger claims on the
//! server databases (a claim's fixed cost is shared by more rows), so after a full claim the
//! claimer grows the next one, up to `claim_growth` times the base, but only as far as the
//! rows in hand can start within a quarter of a lease at the rate deliveries have been
//! finishing. A slow sink therefore keeps base-sized claims, and a short claim (no backlog)
//! resets.

use std::time::{Duration, Instant};

use super::settings::largest_claim;

/// When a claim was asked for, and how many deliveries had finished by then.
pub(super) type Mark = (Instant, u64);

/// The claimer's sizing state: the base and the most, and what the last claims saw.
#[derive(Debug)]
pub(super) struct ClaimSize {
    base: u32,
    most: u32,
    lease: Duration,
    /// The last two claims' [`Mark`]s, older first.
    asked: [Option<Mark>; 2],
    /// Whether the last claim came back with every row it asked for.
    last_full: bool,
}

impl ClaimSize {
    /// `base` rows per claim, growing to at most [`largest_claim`].
    pub(super) fn new(base: u32, growth: u32, lease: Duration) -> ClaimSize {
        ClaimSize { base, most: largest_claim(base, growth), lease, asked: [None, None], last_full: false }
    }

    /// The rows to ask for now, when `finished` deliveries have finished in all.
    ///
    /// The claimer claims whenever no more than this many rows are outstanding, so up to
    /// twice this many are in hand at once; they must all start within a quarter of a lease
    /// at the rate deliveries finished since the claim before last was asked for. That
    /// window spans at least one whole claim's deliveries: since the last claim alone it
    /// would be empty right after a claim that the deliveries had been waiting for (the
    /// claim-bound drain, where growth pays most), and a handful of slow deliveries ending
    /// together would read as a burst.
    pub(super) fn rows(&self, finished: u64, now: Instant) -> u32 {
        if !self.last_full || self.most == self.base {
            return self.base;
        }
        let Some((at, before)) = self.asked[0] else { return self.base };
        let seconds = now.saturating_duration_since(at).as_secs_f64();
        if seconds <= 0.0 {
            return self.base;
        }
        let per_second = finished.saturating_sub(before) as f64 / seconds;
        let fits = per_second * self.lease.as_secs_f64() / 8.0;
        (fits.min(f64::from(self.most)) as u32).clamp(self.base, self.most)
    }

    /// A claim asked for at `asked_at`, for `asked` rows, came back with `got`.
    pub(super) fn claimed(&mut self, asked: u32, got: usize, asked_at: Mark) {
        self.last_full = got >= asked as usize;
        self.asked = [self.asked[1], Some(asked_at)];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::settings::MAX_BATCH_SIZE;

    const LEASE: Duration = Duration::from_secs(30);

    /// A sizer of `base` growing `growth` times, after full claims asked for at each
    /// `(milliseconds after at, deliveries finished by then)`.
    fn after(base: u32, growth: u32, at: Instant, asked: &[(u64, u64)]) -> ClaimSize {
        let mut size = ClaimSize::new(base, growth, LEASE);
        for &(ms, finished) in asked {
            size.claimed(base, base as usize, (at + Duration::from_millis(ms), finished));
        }
        size
    }

    /// Two full claims of 100 asked for at `at` and a millisecond later, nothing finished.
    fn two_claims(at: Instant) -> ClaimSize {
        after(100, 4, at, &[(0, 0), (1, 0)])
    }

    #[test]
    fn the_first_claims_are_the_base() {
        let at = Instant::now();
        assert_eq!(after(100, 4, at, &[]).rows(1_000, at), 100);
        let one = after(100, 4, at, &[(0, 0)]);
        assert_eq!(one.rows(1_000, at + Duration::from_secs(1)), 100, "one claim is not a window yet");
    }

    #[test]
    fn a_fast_drain_after_a_full_claim_grows_to_the_most() {
        let at = Instant::now();
        // 5,000 deliveries a second: a quarter lease holds 37,500, far past 4 × 100.
        assert_eq!(two_claims(at).rows(500, at + Duration::from_millis(100)), 400);
    }

    #[test]
    fn a_claim_bound_drain_grows_the_moment_its_claim_returns() {
        let at = Instant::now();
        // Each claim takes 10 ms, and the deliveries finish the previous claim's 100 rows
        // while it is under way: the claimer asks again the moment a claim returns.
        let size = after(100, 4, at, &[(0, 0), (10, 0)]);
        assert_eq!(size.rows(100, at + Duration::from_millis(20)), 400);
    }

    #[test]
    fn slow_deliveries_ending_together_are_not_a_burst_of_speed() {
        let at = Instant::now();
        // About 5 a second: a claim every 19 s; 16 deliveries end 5 ms after the last one.
        let size = after(100, 4, at, &[(0, 0), (19_000, 100)]);
        assert_eq!(size.rows(116, at + Duration::from_millis(19_005)), 100);
    }

    #[test]
    fn growth_stops_where_the_rows_in_hand_would_outlast_a_quarter_lease() {
        let at = Instant::now();
        // 80 a second: twice 300 rows take 7.5 s, a quarter of the 30 s lease.
        assert_eq!(two_claims(at).rows(80, at + Duration::from_secs(1)), 300);
    }

    #[test]
    fn a_slow_sink_keeps_the_base() {
        let at = Instant::now();
        // 16 deliveries at a time, 3 s each: about 5 a second.
        assert_eq!(two_claims(at).rows(16, at + Duration::from_secs(3)), 100);
        assert_eq!(two_claims(at).rows(0, at + Duration::from_secs(3)), 100);
    }

    #[test]
    fn a_short_claim_resets_to_the_base() {
        let at = Instant::now();
        let mut size = two_claims(at);
        size.claimed(400, 399, (at + Duration::from_millis(2), 0));
        assert_eq!(size.rows(5_000, at + Duration::from_secs(1)), 100);
    }

    #[test]
    fn growth_one_never_grows() {
        let at = Instant::now();
        assert_eq!(after(100, 1, at, &[(0, 0), (1, 0)]).rows(5_000, at + Duration::from_secs(1)), 100);
    }

    #[test]
    fn the_most_stays_within_the_largest_batch() {
        let at = Instant::now();
        let size = after(4_000, 4, at, &[(0, 0), (1, 0)]);
        assert_eq!(size.rows(1_000_000, at + Duration::from_secs(1)), MAX_BATCH_SIZE);
    }
}
