//! Claimed rows waiting to start, queued per room. A room's events start in claim order,
//! across claims, one at a time (or up to the sink's room pipeline): its next event becomes
//! ready only when fewer than that are in flight. Rooms take turns in the order they became
//! ready, so one busy room never holds up the others.
//!
//! Under `rate_limit.per_room`, a room's next event also waits for a token of the room's
//! own bucket: the room is *held* until then, out of line, and no other room waits for it.
//! A held room keeps at most about a second's worth of its rows here ([`RoomLimits::cap`]);
//! the rest go back to be read again, so that a flooding room cannot fill the buffer and
//! with it the reads every other room needs.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use super::rate::TokenBucket;
use super::settings::RateLimit;
use crate::ops::metrics::HeldRoom;
use crate::sandbox::Turn;
use crate::store::Claimed;

/// A room: events of different apps are never merged, even when their room ids match.
pub type RoomKey = (String, String);

/// The room of a claimed row.
pub fn room_of(row: &Claimed) -> RoomKey {
    (row.app_code.clone(), row.room_id.clone())
}

/// Rows claimed and not yet started, and how many deliveries each room has in flight.
pub struct Buffer {
    queued: HashMap<RoomKey, VecDeque<Claimed>>,
    ready: VecDeque<RoomKey>,
    /// The rooms in `ready`.
    waiting: HashSet<RoomKey>,
    busy: HashMap<RoomKey, u32>,
    /// Deliveries of one room in flight at most.
    depth: u32,
    len: usize,
    limits: Option<RoomLimits>,
}

/// `rate_limit.per_room`: each room's bucket while it has rows here or is not yet full again.
struct RoomLimits {
    limit: RateLimit,
    buckets: HashMap<RoomKey, TokenBucket>,
    /// Rooms whose next row waits for a token, and when it comes.
    held: HashMap<RoomKey, Instant>,
    /// When buckets no longer needed were last dropped.
    pruned: Instant,
}

impl RoomLimits {
    /// A room's rows kept here at most: a second's worth, or its burst if larger.
    fn cap(&self) -> usize {
        (self.limit.per_second.ceil() as usize).max(self.limit.burst as usize).clamp(1, 1_000)
    }
}

impl Default for Buffer {
    fn default() -> Self {
        Buffer::new(1)
    }
}

impl Buffer {
    /// A buffer that lets `depth` events of one room be in flight at once (at least 1).
    pub fn new(depth: u32) -> Buffer {
        Buffer {
            queued: HashMap::new(),
            ready: VecDeque::new(),
            waiting: HashSet::new(),
            busy: HashMap::new(),
            depth: depth.max(1),
            len: 0,
            limits: None,
        }
    }

    /// This buffer with each room's deliveries limited to `limit` (`rate_limit.per_room`).
    pub fn with_room_limit(mut self, limit: Option<RateLimit>) -> Buffer {
        self.limits = limit.map(|limit| RoomLimits {
            limit,
            buckets: HashMap::new(),
            held: HashMap::new(),
            pruned: Instant::now(),
        });
        self
    }

    /// Puts the room in line if it has rows and room for another delivery, and under a
    /// per-room limit a token; without a token it is held until the token comes.
    fn line_up(&mut self, room: &RoomKey) {
        self.line_up_at(room, None);
    }

    /// [`Buffer::line_up`] as of `now` (`None`: the clock, read only under a per-room limit).
    fn line_up_at(&mut self, room: &RoomKey, now: Option<Instant>) {
        let free = self.busy.get(room).copied().unwrap_or(0) < self.depth;
        if !free || !self.queued.contains_key(room) || self.waiting.contains(room) {
            return;
        }
        if let Some(limits) = &mut self.limits {
            if limits.held.contains_key(room) {
                return;
            }
            let (limit, now) = (limits.limit, now.unwrap_or_else(Instant::now));
            let bucket = limits.buckets.entry(room.clone()).or_insert_with(|| TokenBucket::new(limit, now));
            if let Some(at) = bucket.ready(now) {
                limits.held.insert(room.clone(), at);
                return;
            }
        }
        self.waiting.insert(room.clone());
        self.ready.push_back(room.clone());
    }

    /// Lines up the held rooms whose token has come by `now`; drops, once a second, the
    /// buckets of rooms with nothing here that have filled up again.
    pub fn wake_held(&mut self, now: Instant) {
        let Some(limits) = &mut self.limits else { return };
        let due: Vec<RoomKey> = limits.held.iter().filter(|(_, at)| **at <= now).map(|(r, _)| r.clone()).collect();
        for room in &due {
            limits.held.remove(room);
        }
        if now.saturating_duration_since(limits.pruned) >= Duration::from_secs(1) {
            limits.pruned = now;
            let (queued, busy) = (&self.queued, &self.busy);
            limits
                .buckets
                .retain(|room, bucket| queued.contains_key(room) || busy.contains_key(room) || !bucket.full(now));
        }
        for room in &due {
            self.line_up_at(room, Some(now));
        }
    }

    /// When the first held room's token comes.
    pub fn next_token(&self) -> Option<Instant> {
        self.limits.as_ref()?.held.values().min().copied()
    }

    /// How many rooms their rate limit holds now.
    pub fn held_count(&self) -> usize {
        self.limits.as_ref().map_or(0, |l| l.held.len())
    }

    /// The rooms held by their rate limit now, most rows waiting first.
    pub fn held_rooms(&self) -> Vec<HeldRoom> {
        let Some(limits) = &self.limits else { return Vec::new() };
        let mut held: Vec<HeldRoom> = limits
            .held
            .keys()
            .map(|room| HeldRoom {
                app_code: room.0.clone(),
                room_id: room.1.clone(),
                queued: self.queued.get(room).map_or(0, VecDeque::len),
            })
            .collect();
        held.sort_by(|a, b| {
            b.queued.cmp(&a.queued).then_with(|| (&a.app_code, &a.room_id).cmp(&(&b.app_code, &b.room_id)))
        });
        held
    }

    /// Rows waiting to start.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Queues newly claimed rows (in claim order) behind their rooms' earlier ones. Returns
    /// those past a rate-limited room's cap, to hand back: each room's are its last ones.
    #[must_use = "rows past a room's cap are to be handed back"]
    pub fn push(&mut self, rows: Vec<Claimed>) -> Vec<Claimed> {
        let cap = self.limits.as_ref().map_or(usize::MAX, RoomLimits::cap);
        let mut over = Vec::new();
        for row in rows {
            let room = room_of(&row);
            let queue = self.queued.entry(room.clone()).or_default();
            if queue.len() >= cap {
                over.push(row);
                continue;
            }
            queue.push_back(row);
            self.len += 1;
            self.line_up(&room);
        }
        over
    }

    /// Whether some room's next row may start now.
    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// The next row that may start: the head of the room that has waited longest. It counts
    /// as in flight until [`Buffer::done`].
    pub fn start_next(&mut self) -> Option<Claimed> {
        let room = self.ready.pop_front()?;
        self.waiting.remove(&room);
        let queue = self.queued.get_mut(&room).expect("a ready room has rows");
        let row = queue.pop_front().expect("a ready room has rows");
        if queue.is_empty() {
            self.queued.remove(&room);
        }
        if let Some(bucket) = self.limits.as_mut().and_then(|l| l.buckets.get_mut(&room)) {
            // The token `line_up` found.
            bucket.take();
        }
        *self.busy.entry(room.clone()).or_default() += 1;
        self.len -= 1;
        self.line_up(&room);
        Some(row)
    }

    /// One of the room's deliveries finished (or its row was handed back): its next row may
    /// start.
    pub fn done(&mut self, room: &RoomKey) {
        if let Some(n) = self.busy.get_mut(room) {
            *n -= 1;
            if *n == 0 {
                self.busy.remove(room);
            }
        }
        self.line_up(room);
    }

    /// Takes the room's rows that have not started (its delivery in flight failed, so they
    /// must not overtake it), for handing back. The room stays busy until [`Buffer::done`].
    pub fn take_room(&mut self, room: &RoomKey) -> Vec<Claimed> {
        let rows: Vec<Claimed> = self.queued.remove(room).map(Vec::from).unwrap_or_default();
        self.len -= rows.len();
        if self.waiting.remove(room) {
            self.ready.retain(|r| r != room);
        }
        if let Some(limits) = &mut self.limits {
            limits.held.remove(room);
        }
        rows
    }

    /// Takes every row that has not started, for handing back.
    pub fn drain(&mut self) -> Vec<Claimed> {
        self.ready.clear();
        self.waiting.clear();
        if let Some(limits) = &mut self.limits {
            limits.held.clear();
        }
        self.len = 0;
        let mut rows: Vec<Claimed> = self.queued.drain().flat_map(|(_, q)| q).collect();
        rows.sort_by_key(|r| (r.created_at_ms, r.id));
        rows
    }
}

/// The outcomes of each room's deliveries in flight, released in the order the deliveries
/// started: with a room pipeline, a later event's outcome waits for the earlier ones, so that
/// what the table records of a room is always in its order.
pub struct InOrder<T> {
    rooms: HashMap<RoomKey, VecDeque<(String, Option<T>)>>,
    /// The turn of each room's latest delivery in flight, which the room's next one waits for.
    turns: HashMap<RoomKey, tokio::sync::oneshot::Receiver<()>>,
}

impl<T> Default for InOrder<T> {
    fn default() -> Self {
        InOrder { rooms: HashMap::new(), turns: HashMap::new() }
    }
}

impl<T> InOrder<T> {
    /// A delivery of `event_id` in `room` started: its turn to send comes after the room's
    /// delivery started before it, if that one is still in flight.
    pub fn started(&mut self, room: &RoomKey, event_id: &str) -> Turn {
        let queue = self.rooms.entry(room.clone()).or_default();
        let previous = if queue.is_empty() { None } else { self.turns.remove(room) };
        queue.push_back((event_id.to_string(), None));
        let (turn, after) = Turn::after(previous);
        self.turns.insert(room.clone(), after);
        turn
    }

    /// A delivery finished with `outcome`: the outcomes now due, in order (none while an
    /// earlier delivery of the room is still in flight).
    pub fn finished(&mut self, room: &RoomKey, event_id: &str, outcome: T) -> Vec<T> {
        let Some(queue) = self.rooms.get_mut(room) else { return vec![outcome] };
        let Some(slot) = queue.iter_mut().find(|(id, done)| id == event_id && done.is_none()) else {
            return vec![outcome];
        };
        slot.1 = Some(outcome);
        let mut due = Vec::new();
        while queue.front().is_some_and(|(_, done)| done.is_some()) {
            due.extend(queue.pop_front().and_then(|(_, done)| done));
        }
        if queue.is_empty() {
            self.rooms.remove(room);
            self.turns.remove(room);
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Lease;
    use std::time::{Duration, Instant};

    fn row(id: i64, room: &str) -> Claimed {
        Claimed {
            id,
            app_code: "app".into(),
            event_id: format!("e{id}"),
            event_type: "T".into(),
            room_id: room.into(),
            envelope: vec![],
            created_at_ms: id,
            retry_count: 0,
            trace_context: None,
            lease: Lease { worker_id: "w".into(), lock_until_ms: 0, fence: None },
            rescued: false,
        }
    }

    #[test]
    fn a_rooms_events_start_one_at_a_time_in_claim_order_across_claims() {
        let mut b = Buffer::default();
        assert!(b.push(vec![row(1, "a"), row(2, "b"), row(3, "a")]).is_empty());
        let first = b.start_next().unwrap();
        let second = b.start_next().unwrap();
        assert_eq!((first.id, second.id), (1, 2));
        assert!(b.start_next().is_none(), "room a's second event started while its first is in flight");
        assert!(b.push(vec![row(4, "a"), row(5, "c")]).is_empty());
        assert_eq!(b.start_next().unwrap().id, 5, "another room goes ahead");
        b.done(&room_of(&first));
        assert_eq!(b.start_next().unwrap().id, 3);
        b.done(&room_of(&first));
        assert_eq!(b.start_next().unwrap().id, 4, "the next claim's event follows in order");
        assert_eq!((b.len(), b.busy.len()), (0, 3));
    }

    #[test]
    fn outcomes_are_released_in_the_order_their_deliveries_started() {
        let mut acks = InOrder::default();
        let room = ("app".to_string(), "a".to_string());
        for id in ["e1", "e2", "e3"] {
            let _turn = acks.started(&room, id);
        }
        assert!(acks.finished(&room, "e2", 2).is_empty(), "e2 waits for e1");
        assert_eq!(acks.finished(&room, "e1", 1), vec![1, 2]);
        assert_eq!(acks.finished(&room, "e3", 3), vec![3]);
        assert!(acks.rooms.is_empty());
    }

    #[test]
    fn a_pipelined_room_has_up_to_its_depth_in_flight_in_order() {
        let mut b = Buffer::new(2);
        assert!(b.push(vec![row(1, "a"), row(2, "a"), row(3, "a"), row(4, "b")]).is_empty());
        let started: Vec<i64> = std::iter::from_fn(|| b.start_next()).map(|r| r.id).collect();
        assert_eq!(started, vec![1, 4, 2], "two of room a, in order, and room b");
        b.done(&("app".to_string(), "a".to_string()));
        assert_eq!(b.start_next().unwrap().id, 3);
        assert!(b.start_next().is_none());
    }

    #[test]
    fn rooms_of_different_apps_are_apart() {
        let mut b = Buffer::default();
        let mut other_app = row(2, "a");
        other_app.app_code = "other".into();
        assert!(b.push(vec![row(1, "a"), other_app]).is_empty());
        assert_eq!(b.start_next().unwrap().id, 1);
        assert_eq!(b.start_next().unwrap().id, 2, "same room id, other app: not held up");
    }

    #[test]
    fn a_rooms_unstarted_rows_can_be_taken_and_other_rooms_go_on() {
        let mut b = Buffer::default();
        assert!(b.push(vec![row(1, "a"), row(2, "a"), row(3, "b"), row(4, "a")]).is_empty());
        let first = b.start_next().unwrap();
        assert_eq!(first.id, 1);
        let taken: Vec<i64> = b.take_room(&room_of(&first)).iter().map(|r| r.id).collect();
        assert_eq!(taken, vec![2, 4]);
        assert_eq!(b.len(), 1);
        b.done(&room_of(&first));
        assert_eq!(b.start_next().unwrap().id, 3);
        assert!(b.start_next().is_none(), "room a has nothing left to start");
    }

    #[test]
    fn a_room_past_its_rate_waits_for_its_token_and_no_other_room_waits() {
        let limit = RateLimit { per_second: 10.0, burst: 1 };
        let mut b = Buffer::default().with_room_limit(Some(limit));
        let over = b.push((1..=15).map(|i| row(i, "hot")).chain([row(16, "b"), row(17, "c")]).collect());
        let over: Vec<i64> = over.iter().map(|r| r.id).collect();
        assert_eq!(over, (11..=15).collect::<Vec<_>>(), "a second's worth kept, the room's last rows handed back");
        let first = b.start_next().unwrap();
        assert_eq!(first.id, 1, "the burst");
        b.done(&room_of(&first));
        let started: Vec<i64> = std::iter::from_fn(|| b.start_next()).map(|r| r.id).collect();
        assert_eq!(started, vec![16, 17], "the hot room is held; the others go on");
        assert_eq!(b.held_rooms().iter().map(|h| (h.room_id.as_str(), h.queued)).collect::<Vec<_>>(), [("hot", 9)]);
        let token = b.next_token().expect("held until its next token");
        assert!(token <= Instant::now() + Duration::from_millis(100), "a token per 100 ms");
        b.wake_held(Instant::now());
        assert!(b.start_next().is_none(), "not before its token");
        // A millisecond past it: the bucket's arithmetic is in floating point.
        b.wake_held(token + Duration::from_millis(1));
        assert_eq!(b.start_next().map(|r| r.id), Some(2), "then its next row, in order");
        assert_eq!(b.held_count(), 0);
    }

    #[test]
    fn drain_returns_every_unstarted_row_in_claim_order() {
        let mut b = Buffer::default();
        assert!(b.push(vec![row(1, "a"), row(2, "a"), row(3, "b"), row(4, "a")]).is_empty());
        let started = b.start_next().unwrap();
        assert_eq!(started.id, 1);
        let ids: Vec<i64> = b.drain().iter().map(|r| r.id).collect();
        assert_eq!(ids, vec![2, 3, 4]);
        assert_eq!(b.len(), 0);
        assert!(b.start_next().is_none());
    }
}
