//! A TCP relay that can cut every connection passing through it, to break the connection of a
//! client we do not control (an SDK client) in the middle of a stream.

use std::net::SocketAddr;

use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running relay; dropping it stops it.
pub struct Relay {
    /// Where clients connect.
    pub addr: SocketAddr,
    cuts: watch::Sender<u64>,
    task: JoinHandle<()>,
}

impl Relay {
    /// Relays connections accepted on `bind` (port 0: any free port) to `target`.
    ///
    /// # Errors
    /// I/O errors of binding.
    pub async fn start(bind: SocketAddr, target: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(bind).await?;
        let addr = listener.local_addr()?;
        let (cuts, rx) = watch::channel(0u64);
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let mut rx = rx.clone();
                rx.borrow_and_update();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = copy_bidirectional(&mut client, &mut server) => {}
                        _ = rx.changed() => {}
                    }
                });
            }
        });
        Ok(Self { addr, cuts, task })
    }

    /// Cuts every connection open now.
    pub fn cut(&self) {
        self.cuts.send_modify(|n| *n += 1);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}
