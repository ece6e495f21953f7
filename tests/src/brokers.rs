//! A NATS server with JetStream of a test's own (`nats-server -js`), on a free loopback port
//! with its store in a temporary directory; stopped when dropped, and restartable on the
//! same port and store (a broker restart).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The server binary (Debian's `nats-server`).
pub const NATS_SERVER: &str = "nats-server";

/// A running `nats-server -js`.
pub struct NatsServer {
    port: u16,
    store: tempfile::TempDir,
    child: Option<Child>,
}

impl NatsServer {
    /// Starts one and waits until it accepts connections.
    pub async fn start() -> NatsServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut server = NatsServer { port, store: tempfile::tempdir().unwrap(), child: None };
        server.restart().await;
        server
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL: nothing is flushed beyond what JetStream already wrote).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and store.
    pub async fn restart(&mut self) {
        self.stop();
        let child = Command::new(NATS_SERVER)
            .args(["-js", "-a", "127.0.0.1", "-p", &self.port.to_string(), "-sd"])
            .arg(self.store.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {NATS_SERVER}: {e} (Debian's package nats-server)"));
        self.child = Some(child);
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("{NATS_SERVER} did not listen on port {} within 5 s", self.port);
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop();
    }
}
