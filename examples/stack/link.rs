//! A network link between one provider process and the in-memory Omni that a test can cut: a TCP
//! relay on loopback. Cut, it forwards nothing and answers nothing, but keeps every connection open,
//! as a lost route or a dropped firewall rule does (calls hang until their own deadlines, they are
//! not refused at once); mended, it closes what it held and relays new connections again.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Link {
    pub addr: SocketAddr,
    up: Arc<watch::Sender<bool>>,
    task: tokio::task::JoinHandle<()>,
}

impl Link {
    /// A link to `upstream`, up.
    pub fn start(upstream: SocketAddr) -> Result<Self, String> {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        std_listener
            .set_nonblocking(true)
            .map_err(|e| e.to_string())?;
        let addr = std_listener.local_addr().map_err(|e| e.to_string())?;
        let listener = TcpListener::from_std(std_listener).map_err(|e| e.to_string())?;
        let (up, _) = watch::channel(true);
        let up = Arc::new(up);
        let task = tokio::spawn(relay(listener, upstream, up.clone()));
        Ok(Self { addr, up, task })
    }

    /// Stops forwarding (connections stay open, silent).
    pub fn cut(&self) {
        self.up.send_replace(false);
    }

    /// Forwards again; the connections held while cut are closed.
    pub fn mend(&self) {
        self.up.send_replace(true);
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay(listener: TcpListener, upstream: SocketAddr, up: Arc<watch::Sender<bool>>) {
    while let Ok((inbound, _)) = listener.accept().await {
        let up = up.subscribe();
        tokio::spawn(carry(inbound, upstream, up));
    }
}

/// One connection: relayed while the link is up; held silent once it is cut, until it is mended.
async fn carry(mut inbound: TcpStream, upstream: SocketAddr, mut up: watch::Receiver<bool>) {
    if *up.borrow() {
        let Ok(mut outbound) = TcpStream::connect(upstream).await else {
            return;
        };
        tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => return,
            _ = up.wait_for(|u| !*u) => {}
        }
    }
    let _ = up.wait_for(|u| *u).await;
}
