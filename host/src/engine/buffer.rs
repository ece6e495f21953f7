//! Claimed rows waiting to start, queued per room. A room's events start one at a time, in
//! claim order, across claims: its next event becomes ready only when the one in flight is
//! done. Rooms take turns in the order they became ready, so one busy room never holds up
//! the others.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::store::Claimed;

/// A room: events of different apps are never merged, even when their room ids match.
pub type RoomKey = (String, String);

/// The room of a claimed row.
pub fn room_of(row: &Claimed) -> RoomKey {
    (row.app_code.clone(), row.room_id.clone())
}

/// Rows claimed and not yet started, and which rooms have a delivery in flight.
#[derive(Default)]
pub struct Buffer {
    queued: HashMap<RoomKey, VecDeque<Claimed>>,
    ready: VecDeque<RoomKey>,
    busy: HashSet<RoomKey>,
    len: usize,
}

impl Buffer {
    /// Rows waiting to start.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Queues newly claimed rows (in claim order) behind their rooms' earlier ones.
    pub fn push(&mut self, rows: Vec<Claimed>) {
        for row in rows {
            let room = room_of(&row);
            let queue = self.queued.entry(room.clone()).or_default();
            if queue.is_empty() && !self.busy.contains(&room) {
                self.ready.push_back(room);
            }
            queue.push_back(row);
            self.len += 1;
        }
    }

    /// Whether some room's next row may start now.
    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// The next row that may start: the head of the room that has waited longest. Its room
    /// is busy until [`Buffer::done`].
    pub fn start_next(&mut self) -> Option<Claimed> {
        let room = self.ready.pop_front()?;
        let queue = self.queued.get_mut(&room).expect("a ready room has rows");
        let row = queue.pop_front().expect("a ready room has rows");
        if queue.is_empty() {
            self.queued.remove(&room);
        }
        self.busy.insert(room);
        self.len -= 1;
        Some(row)
    }

    /// The room's delivery finished (or its row was handed back): its next row may start.
    pub fn done(&mut self, room: &RoomKey) {
        self.busy.remove(room);
        if self.queued.contains_key(room) {
            self.ready.push_back(room.clone());
        }
    }

    /// Takes the room's rows that have not started (its delivery in flight failed, so they
    /// must not overtake it), for handing back. The room stays busy until [`Buffer::done`].
    pub fn take_room(&mut self, room: &RoomKey) -> Vec<Claimed> {
        let rows: Vec<Claimed> = self.queued.remove(room).map(Vec::from).unwrap_or_default();
        self.len -= rows.len();
        rows
    }

    /// Takes every row that has not started, for handing back.
    pub fn drain(&mut self) -> Vec<Claimed> {
        self.ready.clear();
        self.len = 0;
        let mut rows: Vec<Claimed> = self.queued.drain().flat_map(|(_, q)| q).collect();
        rows.sort_by_key(|r| (r.created_at_ms, r.id));
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Lease;

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
            lease: Lease { worker_id: "w".into(), lock_until_ms: 0, fence: None },
            rescued: false,
        }
    }

    #[test]
    fn a_rooms_events_start_one_at_a_time_in_claim_order_across_claims() {
        let mut b = Buffer::default();
        b.push(vec![row(1, "a"), row(2, "b"), row(3, "a")]);
        let first = b.start_next().unwrap();
        let second = b.start_next().unwrap();
        assert_eq!((first.id, second.id), (1, 2));
        assert!(b.start_next().is_none(), "room a's second event started while its first is in flight");
        b.push(vec![row(4, "a"), row(5, "c")]);
        assert_eq!(b.start_next().unwrap().id, 5, "another room goes ahead");
        b.done(&room_of(&first));
        assert_eq!(b.start_next().unwrap().id, 3);
        b.done(&room_of(&first));
        assert_eq!(b.start_next().unwrap().id, 4, "the next claim's event follows in order");
        assert_eq!((b.len(), b.busy.len()), (0, 3));
    }

    #[test]
    fn rooms_of_different_apps_are_apart() {
        let mut b = Buffer::default();
        let mut other_app = row(2, "a");
        other_app.app_code = "other".into();
        b.push(vec![row(1, "a"), other_app]);
        assert_eq!(b.start_next().unwrap().id, 1);
        assert_eq!(b.start_next().unwrap().id, 2, "same room id, other app: not held up");
    }

    #[test]
    fn a_rooms_unstarted_rows_can_be_taken_and_other_rooms_go_on() {
        let mut b = Buffer::default();
        b.push(vec![row(1, "a"), row(2, "a"), row(3, "b"), row(4, "a")]);
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
    fn drain_returns_every_unstarted_row_in_claim_order() {
        let mut b = Buffer::default();
        b.push(vec![row(1, "a"), row(2, "a"), row(3, "b"), row(4, "a")]);
        let started = b.start_next().unwrap();
        assert_eq!(started.id, 1);
        let ids: Vec<i64> = b.drain().iter().map(|r| r.id).collect();
        assert_eq!(ids, vec![2, 3, 4]);
        assert_eq!(b.len(), 0);
        assert!(b.start_next().is_none());
    }
}
