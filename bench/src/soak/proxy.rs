//! A TCP forwarder between the hosts and the database server that can be cut and restored:
//! cut, it drops every forwarded connection and closes new ones at once (an outage, as the
//! hosts see it); restored, it forwards again on the same port.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Forwards connections on a loopback port to the server.
pub struct SwitchProxy {
    addr: SocketAddr,
    /// Whether it is cut, and how many cuts there were (a connection ends at the next one).
    state: watch::Sender<(bool, u64)>,
}

impl SwitchProxy {
    /// Starts forwarding to `target` (`host:port`).
    pub async fn start(target: &str) -> anyhow::Result<SwitchProxy> {
        let target = target.to_string();
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (state, watching) = watch::channel((false, 0u64));
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else { return };
                let (is_cut, generation) = *watching.borrow();
                if is_cut {
                    drop(client);
                    continue;
                }
                let (target, mut changes) = (target.clone(), watching.clone());
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(&target).await else { return };
                    let mut client = client;
                    let cut = async {
                        loop {
                            if changes.changed().await.is_err() {
                                return;
                            }
                            let (now_cut, now_generation) = *changes.borrow();
                            if now_cut || now_generation != generation {
                                return;
                            }
                        }
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        () = cut => {}
                    }
                });
            }
        });
        Ok(SwitchProxy { addr, state })
    }

    /// `127.0.0.1:port`, to connect to instead of the server.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Drops every forwarded connection and refuses new ones.
    pub fn cut(&self) {
        self.state.send_modify(|(cut, generation)| {
            *cut = true;
            *generation += 1;
        });
    }

    /// Forwards again.
    pub fn restore(&self) {
        self.state.send_modify(|(cut, _)| *cut = false);
    }
}
