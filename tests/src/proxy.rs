//! A TCP forwarder in front of a database server that a test (or the soak) can cut and
//! restore: cut, it drops every forwarded connection and closes new ones at once (a real
//! outage for the host under test, while the server keeps serving everyone else); restored,
//! it forwards again on the same port.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Forwards connections on a loopback port to a server.
pub struct TcpProxy {
    addr: SocketAddr,
    /// Whether it is cut, and how many cuts there were (a connection ends at the next one).
    state: watch::Sender<(bool, u64)>,
    /// Connections closed at once because it was cut.
    turned_away: Arc<AtomicUsize>,
}

impl TcpProxy {
    /// Starts forwarding to the server of database URL `url` (cut at first when `cut`).
    pub async fn in_front_of(url: &str, cut: bool) -> TcpProxy {
        let url = reqwest::Url::parse(url).expect("a database URL");
        let host = url.host_str().expect("a database URL with a host");
        let target = format!("{host}:{}", url.port_or_known_default().expect("a database URL with a port"));
        TcpProxy::listen(&target, cut).await
    }

    /// `url` (a URL of the same server) reaching it through this proxy.
    pub fn url_through(&self, url: &str) -> String {
        let mut url = reqwest::Url::parse(url).expect("a database URL");
        url.set_host(Some("127.0.0.1")).expect("a URL that has a host");
        url.set_port(Some(self.addr.port())).expect("a URL that has a port");
        url.to_string()
    }

    async fn listen(target: &str, cut: bool) -> TcpProxy {
        let target = target.to_string();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binding the proxy");
        let addr = listener.local_addr().expect("a bound address");
        let (state, watching) = watch::channel((cut, 0u64));
        let turned_away = Arc::new(AtomicUsize::new(0));
        let counted = turned_away.clone();
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else { return };
                let (is_cut, generation) = *watching.borrow();
                if is_cut {
                    drop(client);
                    counted.fetch_add(1, Ordering::SeqCst);
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
        TcpProxy { addr, state, turned_away }
    }

    /// `127.0.0.1:port`, to connect to instead of the server.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Drops every forwarded connection and closes new ones at once.
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

    /// Connections closed at once because it was cut.
    pub fn turned_away(&self) -> usize {
        self.turned_away.load(Ordering::SeqCst)
    }
}
