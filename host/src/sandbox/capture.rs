//! A guest's stdout or stderr, captured up to a byte budget. Writes past the budget are
//! accepted and dropped (and counted), so a chatty guest is never trapped by a closed pipe.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

/// How much a guest may write in one call; it is always ready for that much.
const WRITE_WINDOW: usize = 64 * 1024;

/// A capture buffer shared by the WASI stream and the host that reads it afterwards.
#[derive(Clone)]
pub struct Capture {
    inner: Arc<Mutex<Captured>>,
    limit: usize,
}

#[derive(Default)]
struct Captured {
    kept: Vec<u8>,
    dropped: u64,
}

impl Capture {
    /// An empty capture that keeps at most `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Capture { inner: Arc::default(), limit }
    }

    fn take(&self, bytes: &[u8]) {
        let mut c = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let room = self.limit.saturating_sub(c.kept.len());
        let kept = bytes.len().min(room);
        c.kept.extend_from_slice(&bytes[..kept]);
        c.dropped += (bytes.len() - kept) as u64;
    }

    /// What was kept, and how many bytes were dropped past the budget, since the last time
    /// this was asked: the capture is empty again afterwards (a reused instance's next call
    /// starts with a budget of its own).
    pub fn contents(&self) -> (Vec<u8>, u64) {
        let mut c = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        (std::mem::take(&mut c.kept), std::mem::take(&mut c.dropped))
    }
}

impl IsTerminal for Capture {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Capture {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[async_trait::async_trait]
impl OutputStream for Capture {
    fn write(&mut self, bytes: Bytes) -> Result<(), StreamError> {
        self.take(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(WRITE_WINDOW)
    }
}

#[async_trait::async_trait]
impl Pollable for Capture {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for Capture {
    fn poll_write(self: Pin<&mut Self>, _cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.take(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_past_the_budget_are_dropped_and_counted_never_refused() {
        let mut capture = Capture::new(10);
        for _ in 0..3 {
            assert!(OutputStream::write(&mut capture, Bytes::from_static(b"hello\n")).is_ok());
            assert_eq!(capture.check_write().unwrap(), WRITE_WINDOW, "always ready, never closed");
        }
        let (kept, dropped) = capture.contents();
        assert_eq!(kept, b"hello\nhell");
        assert_eq!(dropped, 8);
        assert_eq!(capture.contents(), (Vec::new(), 0), "read once, empty again");
        assert!(OutputStream::write(&mut capture, Bytes::from_static(b"again\n")).is_ok());
        assert_eq!(capture.contents(), (b"again\n".to_vec(), 0), "a fresh budget after a read");
    }
}
