//! A TCP relay that can cut every connection passing through it, to break the connection of a
//! client we do not control (an SDK client) in the middle of a stream, or stand in front of a
//! pod's port and make it unavailable for a while ([`Relay::refuse_for`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running relay; dropping it stops it.
pub struct Relay {
    /// Where clients connect.
    pub addr: SocketAddr,
    cuts: watch::Sender<u64>,
    /// Until when new connections are closed at once.
    refusing: watch::Sender<Option<Instant>>,
    refused: Arc<AtomicUsize>,
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
        let (refusing, until) = watch::channel(None::<Instant>);
        let refused = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&refused);
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if until.borrow().is_some_and(|t| Instant::now() < t) {
                    counted.fetch_add(1, Ordering::Relaxed);
                    drop(client);
                    continue;
                }
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
        Ok(Self {
            addr,
            cuts,
            refusing,
            refused,
            task,
        })
    }

    /// Cuts every connection open now.
    pub fn cut(&self) {
        self.cuts.send_modify(|n| *n += 1);
    }

    /// Cuts every connection open now, and for `outage` closes each new one as soon as it is
    /// accepted, before a byte passes: the target is unavailable through the relay.
    pub fn refuse_for(&self, outage: Duration) {
        self.refusing.send_replace(Some(Instant::now() + outage));
        self.cut();
    }

    /// Connections closed at once because they came during an outage ([`Relay::refuse_for`]).
    pub fn refused(&self) -> usize {
        self.refused.load(Ordering::Relaxed)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}
