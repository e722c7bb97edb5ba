//! A relay in front of a pod's peer port while peer TLS is off (`PodSpec::peer_tls` false) that
//! sees the HTTP/1.1 requests passing through it: it records each one whole, byte for byte as
//! the sender wrote it (to send again elsewhere: [`Recorded::send_to`]), and withholds the
//! answers to the paths a rule names — such a request reaches the pod and is carried out, then
//! the connection is cut at the first byte of its answer, so the sender never learns the outcome
//! (a lost acknowledgement).
//!
//! Requests are framed by `Content-Length`, as sidecars send them; from a request framed
//! otherwise (chunked) on, a connection is relayed without being looked at.
//!
//! It also counts the connections it relays: open now, and the most open at once (put in front
//! of an MCP server, how many connections a sidecar keeps to it).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::{HarnessError, Result};

/// How long [`Recorded::send_to`] waits for the whole answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// Which requests' answers a [`Tap`] withholds, by path.
pub type Withhold = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// A running tap; dropping it stops accepting (connections open go on).
pub struct Tap {
    /// Where senders connect.
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Recorded>>>,
    withheld: Arc<AtomicUsize>,
    connections: Arc<Connections>,
    task: JoinHandle<()>,
}

/// Connections relayed: open now, and the most open at once since the last reset.
#[derive(Debug, Default)]
struct Connections {
    open: AtomicUsize,
    peak: AtomicUsize,
}

/// One relayed connection, counted open until dropped.
struct Counted(Arc<Connections>);

impl Counted {
    fn new(connections: &Arc<Connections>) -> Self {
        let open = connections.open.fetch_add(1, Ordering::SeqCst) + 1;
        connections.peak.fetch_max(open, Ordering::SeqCst);
        Self(Arc::clone(connections))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One request that passed, as sent.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// Its path.
    pub path: String,
    /// The head and the body, exactly as the sender wrote them.
    pub bytes: Bytes,
    /// Where the body starts in [`Recorded::bytes`].
    body_at: usize,
}

/// An answer to [`Recorded::send_to`].
#[derive(Clone, Debug)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// The head, as text.
    pub head: String,
    /// The body, as text.
    pub body: String,
}

impl Tap {
    /// Relays connections accepted on `bind` to `target`, recording every request and
    /// withholding the answer to each request whose path `withhold` picks.
    ///
    /// # Errors
    /// I/O errors of binding.
    pub async fn start(
        bind: SocketAddr,
        target: SocketAddr,
        withhold: Withhold,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(bind).await?;
        let addr = listener.local_addr()?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let withheld = Arc::new(AtomicUsize::new(0));
        let connections = Arc::new(Connections::default());
        let (record, count, open) = (
            Arc::clone(&seen),
            Arc::clone(&withheld),
            Arc::clone(&connections),
        );
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let counted = Counted::new(&open);
                let Ok(server) = TcpStream::connect(target).await else {
                    continue;
                };
                let (record, count, withhold) = (
                    Arc::clone(&record),
                    Arc::clone(&count),
                    Arc::clone(&withhold),
                );
                tokio::spawn(async move {
                    relay(client, server, record, count, withhold).await;
                    drop(counted);
                });
            }
        });
        Ok(Self {
            addr,
            seen,
            withheld,
            connections,
            task,
        })
    }

    /// The requests recorded so far, in the order they were complete.
    pub fn recorded(&self) -> Vec<Recorded> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The recorded requests to `path`.
    pub fn recorded_to(&self, path: &str) -> Vec<Recorded> {
        self.recorded()
            .into_iter()
            .filter(|r| r.path == path)
            .collect()
    }

    /// Answers withheld so far.
    pub fn withheld(&self) -> usize {
        self.withheld.load(Ordering::Relaxed)
    }

    /// Connections open now (until either side closed one).
    pub fn open_connections(&self) -> usize {
        self.connections.open.load(Ordering::SeqCst)
    }

    /// The most connections open at once since the tap started or [`Tap::reset_peak`].
    pub fn peak_connections(&self) -> usize {
        self.connections.peak.load(Ordering::SeqCst)
    }

    /// Starts the peak over from the connections open now.
    pub fn reset_peak(&self) {
        let c = &self.connections;
        c.peak
            .store(c.open.load(Ordering::SeqCst), Ordering::SeqCst);
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Relays one connection until either side closes it, or an answer is withheld.
async fn relay(
    client: TcpStream,
    server: TcpStream,
    record: Arc<Mutex<Vec<Recorded>>>,
    withheld: Arc<AtomicUsize>,
    withhold: Withhold,
) {
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let (from_client, to_client) = client.into_split();
    let (from_server, to_server) = server.into_split();
    // Whether the answer to the request on its way now is withheld: set from its head, before
    // a byte of it reaches the server (HTTP/1.1 senders do not pipeline).
    let withholding = Arc::new(AtomicBool::new(false));
    let up = requests(from_client, to_server, &record, &withholding, &withhold);
    let down = answers(from_server, to_client, &withholding, &withheld);
    tokio::pin!(up, down);
    tokio::select! {
        () = &mut down => {}
        up = &mut up => {
            if up.is_ok() {
                down.await;
            }
        }
    }
}

/// Passes the sender's bytes to the server, recording each request once it is complete.
async fn requests(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    record: &Mutex<Vec<Recorded>>,
    withholding: &AtomicBool,
    withhold: &Withhold,
) -> std::io::Result<()> {
    let mut framer = Framer::default();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = from.read(&mut chunk).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        for event in framer.push(&chunk[..n]) {
            match event {
                Framed::Head(path) => withholding.store(withhold(&path), Ordering::SeqCst),
                Framed::Whole(request) => record
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(request),
            }
        }
        to.write_all(&chunk[..n]).await?;
    }
}

/// Passes the server's bytes to the sender, unless they answer a request whose answer is
/// withheld: then returns at once, and the connection is cut.
async fn answers(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    withholding: &AtomicBool,
    withheld: &AtomicUsize,
) {
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut chunk).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        if withholding.load(Ordering::SeqCst) {
            withheld.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if to.write_all(&chunk[..n]).await.is_err() {
            return;
        }
    }
}

/// What [`Framer::push`] found.
enum Framed {
    /// A request head arrived: its path.
    Head(String),
    /// A request is complete.
    Whole(Recorded),
}

/// Cuts a byte stream of HTTP/1.1 requests framed by `Content-Length` into requests.
#[derive(Default)]
struct Framer {
    buf: Vec<u8>,
    /// The request under way: its path, head length and body length.
    current: Option<(String, usize, usize)>,
    /// A request framed otherwise was seen: nothing more is looked at.
    blind: bool,
}

impl Framer {
    fn push(&mut self, bytes: &[u8]) -> Vec<Framed> {
        let mut out = Vec::new();
        if self.blind {
            return out;
        }
        self.buf.extend_from_slice(bytes);
        loop {
            if self.current.is_none() {
                let Some(end) = head_end(&self.buf) else {
                    return out;
                };
                let head = String::from_utf8_lossy(&self.buf[..end]).into_owned();
                if header(&head, "transfer-encoding").is_some() {
                    self.blind = true;
                    self.buf = Vec::new();
                    return out;
                }
                let path = head
                    .split_whitespace()
                    .nth(1)
                    .unwrap_or_default()
                    .to_owned();
                let length = header(&head, "content-length")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                out.push(Framed::Head(path.clone()));
                self.current = Some((path, end, length));
            }
            let Some((path, head, length)) = self.current.take() else {
                return out;
            };
            if self.buf.len() < head + length {
                self.current = Some((path, head, length));
                return out;
            }
            let rest = self.buf.split_off(head + length);
            let bytes = Bytes::from(std::mem::replace(&mut self.buf, rest));
            out.push(Framed::Whole(Recorded {
                path,
                bytes,
                body_at: head,
            }));
        }
    }
}

/// The length of the head at the start of `buf` (through its blank line), once complete.
fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|at| at + 4)
}

/// The value of header field `name` (any case) in `head`.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|line| {
        let (field, value) = line.split_once(':')?;
        field
            .trim()
            .eq_ignore_ascii_case(name)
            .then(|| value.trim())
    })
}

impl Recorded {
    /// The head, as text.
    pub fn head(&self) -> String {
        String::from_utf8_lossy(&self.bytes[..self.body_at]).into_owned()
    }

    /// The body.
    pub fn body(&self) -> &[u8] {
        &self.bytes[self.body_at..]
    }

    /// The value of header field `name` (any case).
    pub fn header(&self, name: &str) -> Option<String> {
        header(&self.head(), name).map(str::to_owned)
    }

    /// This request with the value of header field `name` replaced by `value` (its bytes
    /// otherwise unchanged).
    pub fn with_header(&self, name: &str, value: &str) -> Self {
        let head: Vec<String> = self
            .head()
            .split("\r\n")
            .map(|line| match line.split_once(':') {
                Some((field, _)) if field.trim().eq_ignore_ascii_case(name) => {
                    format!("{field}: {value}")
                }
                _ => line.to_owned(),
            })
            .collect();
        let head = head.join("\r\n");
        let mut bytes = head.clone().into_bytes();
        bytes.extend_from_slice(self.body());
        Self {
            path: self.path.clone(),
            bytes: Bytes::from(bytes),
            body_at: head.len(),
        }
    }

    /// Sends these bytes, as they are, on a new connection to `addr`; the answer (framed by
    /// `Content-Length`, or the connection's end).
    ///
    /// # Errors
    /// [`HarnessError`] when the exchange fails or no whole answer arrives within 10 s.
    pub async fn send_to(&self, addr: SocketAddr) -> Result<Answer> {
        let exchange = async {
            let mut conn = TcpStream::connect(addr).await?;
            conn.write_all(&self.bytes).await?;
            let mut buf = Vec::new();
            let mut chunk = vec![0u8; 16 * 1024];
            let mut framed: Option<(usize, Option<usize>)> = None;
            loop {
                if framed.is_none()
                    && let Some(end) = head_end(&buf)
                {
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    let length = header(&head, "content-length").and_then(|v| v.parse().ok());
                    framed = Some((end, length));
                }
                if let Some((end, Some(length))) = framed
                    && buf.len() >= end + length
                {
                    buf.truncate(end + length);
                    break;
                }
                let n = conn.read(&mut chunk).await?;
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            Ok::<_, HarnessError>((buf, framed))
        };
        let (buf, framed) = tokio::time::timeout(ANSWER_TIMEOUT, exchange)
            .await
            .map_err(|_| HarnessError::Protocol(format!("no whole answer from {addr}")))??;
        let Some((end, _)) = framed else {
            return Err(HarnessError::Protocol(format!(
                "{addr} closed without an answer: {:?}",
                String::from_utf8_lossy(&buf)
            )));
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| HarnessError::Protocol(format!("no status in {head:?}")))?;
        Ok(Answer {
            status,
            body: String::from_utf8_lossy(&buf[end..]).into_owned(),
            head,
        })
    }
}

impl Answer {
    /// The value of header field `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.head, name)
    }

    /// The `reason` of a JSON error body.
    pub fn reason(&self) -> Option<String> {
        let body: serde_json::Value = serde_json::from_str(&self.body).ok()?;
        Some(body.get("reason")?.as_str()?.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_framed_across_chunks_and_headers_replaced() {
        let stream = b"POST /v2/held HTTP/1.1\r\nContent-Length: 2\r\nX-A: 1\r\n\r\n{}\
                       GET /x HTTP/1.1\r\n\r\n";
        let mut framer = Framer::default();
        let mut whole = Vec::new();
        let mut heads = Vec::new();
        for byte in stream.chunks(3) {
            for event in framer.push(byte) {
                match event {
                    Framed::Head(path) => heads.push(path),
                    Framed::Whole(r) => whole.push(r),
                }
            }
        }
        assert_eq!(heads, ["/v2/held", "/x"]);
        assert_eq!(whole.len(), 2);
        assert_eq!(whole[0].body(), b"{}");
        assert_eq!(whole[0].header("x-a").as_deref(), Some("1"));
        assert_eq!(whole[1].bytes.as_ref(), b"GET /x HTTP/1.1\r\n\r\n");
        let changed = whole[0].with_header("X-A", "2");
        assert_eq!(changed.header("x-a").as_deref(), Some("2"));
        assert_eq!(changed.body(), b"{}");
        assert_eq!(changed.bytes.len(), whole[0].bytes.len());
    }
}
