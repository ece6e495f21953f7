//! `sink.rate_limit`: a token bucket over the deliveries this host starts. A delivery waits
//! for a token; it is never failed for the want of one. The bucket is per host: N hosts on
//! one table send up to N times the rate (see the README).

use std::time::{Duration, Instant};

use super::settings::RateLimit;

/// The longest the bucket asks to wait before looking again.
const MAX_WAIT: Duration = Duration::from_secs(3_600);

/// Tokens refilled at the limit's rate, up to its burst.
#[derive(Debug)]
pub struct TokenBucket {
    per_second: f64,
    burst: f64,
    tokens: f64,
    refilled: Instant,
}

impl TokenBucket {
    /// A full bucket for `limit`, as of `now`.
    pub fn new(limit: RateLimit, now: Instant) -> TokenBucket {
        let burst = f64::from(limit.burst.max(1));
        TokenBucket { per_second: limit.per_second, burst, tokens: burst, refilled: now }
    }

    /// `None` when a token is there to take at `now`; otherwise when the next one will be.
    pub fn ready(&mut self, now: Instant) -> Option<Instant> {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.burst);
        self.refilled = now;
        if self.tokens >= 1.0 {
            return None;
        }
        // A rate so low that the wait overflows waits an hour, then asks again.
        let wait = Duration::try_from_secs_f64((1.0 - self.tokens) / self.per_second).unwrap_or(MAX_WAIT).min(MAX_WAIT);
        Some(now + wait)
    }

    /// Whether the bucket has filled up again by `now` (a fresh one would be the same).
    pub fn full(&mut self, now: Instant) -> bool {
        let _ = self.ready(now);
        self.tokens >= self.burst
    }

    /// Takes the token [`TokenBucket::ready`] said is there.
    pub fn take(&mut self) {
        self.tokens -= 1.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(per_second: f64, burst: u32) -> RateLimit {
        RateLimit { per_second, burst }
    }

    /// Takes every token available at `now`; returns how many.
    fn drain(bucket: &mut TokenBucket, now: Instant) -> usize {
        let mut taken = 0;
        while bucket.ready(now).is_none() {
            bucket.take();
            taken += 1;
        }
        taken
    }

    #[test]
    fn a_full_bucket_gives_its_burst_then_refills_at_the_rate() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(limit(100.0, 10), start);
        assert_eq!(drain(&mut bucket, start), 10, "the burst at once");
        let next = bucket.ready(start).expect("empty");
        assert_eq!(next - start, Duration::from_millis(10), "one token per 10 ms at 100/s");
        assert_eq!(drain(&mut bucket, start + Duration::from_millis(55)), 5);
        assert_eq!(drain(&mut bucket, start + Duration::from_secs(60)), 10, "never more than the burst");
    }

    #[test]
    fn over_any_second_no_more_than_the_rate_plus_the_burst_start() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(limit(100.0, 10), start);
        let mut starts = Vec::new();
        let mut now = start;
        while now < start + Duration::from_secs(10) {
            match bucket.ready(now) {
                None => {
                    bucket.take();
                    starts.push(now);
                }
                Some(next) => now = next,
            }
        }
        for (i, first) in starts.iter().enumerate() {
            let in_a_second = starts[i..].iter().take_while(|t| **t < *first + Duration::from_secs(1)).count();
            assert!(in_a_second <= 110, "{in_a_second} starts within a second from {:?}", *first - start);
        }
        assert!((1_000..=1_010).contains(&starts.len()), "{} starts in 10 s", starts.len());
    }

    #[test]
    fn an_absurdly_slow_rate_waits_an_hour_at_most_instead_of_overflowing() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(limit(1e-300, 1), start);
        bucket.take();
        assert_eq!(bucket.ready(start), Some(start + MAX_WAIT));
    }

    #[test]
    fn a_slow_rate_waits_whole_seconds() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(limit(0.5, 1), start);
        bucket.take();
        assert_eq!(bucket.ready(start), Some(start + Duration::from_secs(2)));
    }
}
