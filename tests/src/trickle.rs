//! Slow connections, as a slow-loris client holds them: each sends the same bytes, the first ones
//! at once and the rest one at a time with a pause between them, and reads nothing but the
//! server's answer or closing; a connection the server closes (or answers) is opened again after
//! a pause, so the number open stays the same until the [`Trickle`] is dropped.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

/// Slow connections to one address; dropping it closes them.
pub struct Trickle {
    opened: Arc<AtomicUsize>,
    ended: Arc<AtomicUsize>,
    tasks: Vec<JoinHandle<()>>,
}

impl Trickle {
    /// Keeps `count` connections to `addr` open, each sending `head` at once, then `slow` one
    /// byte every `every` (then nothing more) until the server closes it or answers; then it is
    /// opened again `every` later.
    pub fn start(
        addr: SocketAddr,
        head: &[u8],
        slow: &[u8],
        count: usize,
        every: Duration,
    ) -> Self {
        let opened = Arc::new(AtomicUsize::new(0));
        let ended = Arc::new(AtomicUsize::new(0));
        let tasks = (0..count)
            .map(|_| {
                let (opened, ended) = (Arc::clone(&opened), Arc::clone(&ended));
                let (head, slow) = (head.to_vec(), slow.to_vec());
                tokio::spawn(async move {
                    loop {
                        let Ok(conn) = TcpStream::connect(addr).await else {
                            tokio::time::sleep(every).await;
                            continue;
                        };
                        opened.fetch_add(1, Ordering::Relaxed);
                        trickle(conn, &head, &slow, every).await;
                        ended.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(every).await;
                    }
                })
            })
            .collect();
        Self {
            opened,
            ended,
            tasks,
        }
    }

    /// Connections opened so far.
    pub fn opened(&self) -> usize {
        self.opened.load(Ordering::Relaxed)
    }

    /// Connections the server closed or answered so far.
    pub fn ended(&self) -> usize {
        self.ended.load(Ordering::Relaxed)
    }
}

impl Drop for Trickle {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Sends `head` on `conn`, then `slow` one byte at a time, `every` apart, until the server
/// answers or closes.
async fn trickle(conn: TcpStream, head: &[u8], slow: &[u8], every: Duration) {
    let _ = conn.set_nodelay(true);
    let (mut read, mut write) = conn.into_split();
    let mut answer = [0u8; 1];
    let send = async {
        if write.write_all(head).await.is_err() {
            return;
        }
        for byte in slow {
            if write.write_all(std::slice::from_ref(byte)).await.is_err() {
                return;
            }
            tokio::time::sleep(every).await;
        }
        std::future::pending::<()>().await;
    };
    tokio::select! {
        _ = read.read(&mut answer) => {}
        () = send => {}
    }
}
