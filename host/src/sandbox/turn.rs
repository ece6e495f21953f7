//! A room's turn to send, under a room pipeline: the engine starts a room's events in
//! order, each with a [`Turn`] chained to the one started before it, so that a publisher can
//! put each event on the wire only after the room's previous event, while their acks are
//! still in flight together.

use tokio::sync::oneshot;

/// One delivery's place in its room's line: it may send once the room's previous event has
/// been sent, and it lets the next one go once it has sent itself. A delivery that ends
/// without sending (its routing failed, its turn never came) drops its turn, and the next
/// event learns that its predecessor will not be on the wire before it.
#[derive(Debug, Default)]
pub struct Turn {
    previous: Option<oneshot::Receiver<()>>,
    next: Option<oneshot::Sender<()>>,
}

impl Turn {
    /// The turn of a room's next event, after `previous` (the receiving end of the turn
    /// started before it, if one may still be in flight); and the receiving end of this one,
    /// for the event after it.
    pub fn after(previous: Option<oneshot::Receiver<()>>) -> (Turn, oneshot::Receiver<()>) {
        let (next, after) = oneshot::channel();
        (Turn { previous, next: Some(next) }, after)
    }

    /// Waits until the room's previous event has been sent: `true`, or `false` if it never
    /// will be (it ended without sending, so this one must not go ahead of it).
    pub async fn wait(&mut self) -> bool {
        match self.previous.take() {
            None => true,
            Some(previous) => previous.await.is_ok(),
        }
    }

    /// This event is on the wire: the room's next one may send.
    pub fn sent(&mut self) {
        if let Some(next) = self.next.take() {
            let _ = next.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_turn_comes_after_the_one_before_has_sent() {
        let (mut first, after_first) = Turn::after(None);
        let (mut second, after_second) = Turn::after(Some(after_first));
        let (mut third, _) = Turn::after(Some(after_second));
        assert!(first.wait().await, "the first of a line waits for nothing");
        let waiting = tokio::spawn(async move { second.wait().await.then_some(second) });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "the second waits for the first to send");
        first.sent();
        let second = waiting.await.unwrap().expect("its turn came");
        drop(second);
        assert!(!third.wait().await, "the second ended without sending: the third must not go ahead");
    }
}
