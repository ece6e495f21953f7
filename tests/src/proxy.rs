//! A TCP forwarder in front of a database server, which a test can cut to make the database
//! unreachable from the host under test (a real outage for the host, while the server keeps
//! serving every other test).

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Forwards connections on a loopback port to `target` until [`TcpProxy::cut`].
pub struct TcpProxy {
    addr: SocketAddr,
    cut: watch::Sender<bool>,
}

impl TcpProxy {
    /// Starts forwarding to `target` (`host:port`).
    pub async fn start(target: &str) -> TcpProxy {
        let target = target.to_string();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binding the proxy");
        let addr = listener.local_addr().unwrap();
        let (cut, mut watch) = watch::channel(false);
        tokio::spawn(async move {
            loop {
                let (client, _) = tokio::select! {
                    accepted = listener.accept() => match accepted { Ok(a) => a, Err(_) => return },
                    _ = watch.changed() => return, // dropping the listener refuses new connections
                };
                let (target, mut cut) = (target.clone(), watch.clone());
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(&target).await else { return };
                    let mut client = client;
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        TcpProxy { addr, cut }
    }

    /// `127.0.0.1:port` to connect to instead of the server.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Drops every forwarded connection and refuses new ones.
    pub fn cut(&self) {
        let _ = self.cut.send(true);
    }
}
