//! Brokers of a test's own: a `nats-server -js`, a `redis-server` or a `mosquitto`, on a
//! free loopback port (NATS with its store in a temporary directory); killed when dropped,
//! and restartable on the same port and store (a broker restart).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Which server.
#[derive(Clone, Copy, Debug)]
pub enum Broker {
    /// Debian's `nats-server`, with JetStream.
    Nats,
    /// Debian's `redis-server`, keeping nothing on disk.
    Redis,
    /// Debian's `mosquitto`, keeping persistent sessions in its store across a clean
    /// restart.
    Mosquitto,
}

impl Broker {
    fn program(self) -> &'static str {
        match self {
            Broker::Nats => "nats-server",
            Broker::Redis => "redis-server",
            Broker::Mosquitto => "mosquitto",
        }
    }

    fn scheme(self) -> &'static str {
        match self {
            Broker::Nats => "nats",
            Broker::Redis => "redis",
            Broker::Mosquitto => "mqtt",
        }
    }
}

/// A running broker of a test's own.
pub struct BrokerServer {
    broker: Broker,
    port: u16,
    store: tempfile::TempDir,
    child: Option<Child>,
}

/// The NATS server of the relay tests.
pub type NatsServer = BrokerServer;

impl BrokerServer {
    /// A `nats-server -js`, listening.
    pub async fn start() -> BrokerServer {
        BrokerServer::of(Broker::Nats).await
    }

    /// One of `broker`, listening.
    pub async fn of(broker: Broker) -> BrokerServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut server = BrokerServer { broker, port, store: tempfile::tempdir().unwrap(), child: None };
        server.restart().await;
        server
    }

    /// `<scheme>://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.broker.scheme(), self.port)
    }

    /// Sends it `kill -<signal>` (`STOP` freezes it with its connections open, `CONT`
    /// thaws it).
    pub fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("the server runs");
        let status = Command::new("kill").args([&format!("-{signal}"), &child.id().to_string()]).status().unwrap();
        assert!(status.success(), "kill -{signal} {}", child.id());
    }

    /// Kills the server (SIGKILL: nothing is flushed beyond what it already wrote).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and store.
    pub async fn restart(&mut self) {
        self.stop();
        let port = self.port.to_string();
        let mut command = Command::new(self.broker.program());
        match self.broker {
            Broker::Nats => command.args(["-js", "-a", "127.0.0.1", "-p", &port, "-sd"]).arg(self.store.path()),
            Broker::Redis => command.args(["--port", &port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]),
            Broker::Mosquitto => {
                // Persistent sessions kept in the store across a clean restart (SIGTERM).
                // Started as root, mosquitto drops to its own user: the store must let it write.
                use std::os::unix::fs::PermissionsExt as _;
                std::fs::set_permissions(self.store.path(), std::fs::Permissions::from_mode(0o777))
                    .expect("opening the store to mosquitto");
                let config = self.store.path().join("mosquitto.conf");
                let text = format!(
                    "listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location {}/\n",
                    self.store.path().display()
                );
                std::fs::write(&config, text).expect("writing mosquitto.conf");
                command.arg("-c").arg(config)
            }
        };
        let program = self.broker.program();
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {program}: {e} (Debian's package of that name)"));
        self.child = Some(child);
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("{program} did not listen on port {} within 5 s", self.port);
    }
}

impl Drop for BrokerServer {
    fn drop(&mut self) {
        self.stop();
    }
}
