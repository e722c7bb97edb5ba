//! A small MCP Streamable HTTP client on hyper, for tests and the demo.
//!
//! Unlike an SDK client it exposes the raw exchange: status codes, headers and SSE events with
//! their ids, and it lets the caller drop a connection mid-stream (dropping the body closes the
//! connection) and resume with `GET` + `Last-Event-ID`.

use std::collections::HashSet;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{Stream, StreamExt};
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use sse_stream::{Sse, SseStream};

use crate::auth::Tokens;
use crate::{HarnessError, Result};

/// `Accept` of every POST (spec T-03).
pub const ACCEPT_BOTH: &str = "application/json, text/event-stream";

/// Longest wait for a response's headers ([`Http::send`]): far beyond any answer the tests
/// expect (a drain's deadline, a held request), short of the rollout's 90 s finish.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);

/// A response whose headers took this long or longer is *late* ([`Http::late_heads`]): a
/// client left waiting that long is hung in all but name.
pub const LATE_HEAD: Duration = Duration::from_secs(10);

/// The pod a response came from: the host of the URL its request was sent to (set on every
/// response by [`Http::send`]; the sidecar logs of a run are named after it, `pod <host>`).
#[derive(Clone, Debug)]
pub(crate) struct AnsweredBy(pub(crate) String);

/// A pooled HTTP/1.1 client. Its clones share the pool and the count of late responses.
#[derive(Clone, Debug)]
pub struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
    heads: Arc<HeadWaits>,
}

/// Late requests described at most ([`Http::late_requests`]); the rest are only counted.
const MAX_LATE_DESCRIBED: usize = 100;

/// How long responses kept their clients waiting for headers.
#[derive(Debug, Default)]
struct HeadWaits {
    /// Requests answered (or given up) after [`LATE_HEAD`] or more.
    late: AtomicU64,
    /// The longest wait, in milliseconds.
    longest_ms: AtomicU64,
    /// The first of those answered late (those given up are failures of their own).
    described: Mutex<Vec<LateRequest>>,
    /// What the answers said, beside how long they took.
    answers: Answers,
}

/// What the answers to a client and its clones said: how many were 503s, and when a watched
/// set of sessions was first served again ([`McpClient::watch_sessions`]).
#[derive(Debug, Default)]
struct Answers {
    /// Answers 503 (each attempt of a request sent again after its `Retry-After` counts).
    unavailable: AtomicU64,
    /// Whether [`Answers::watched`] is set: most clients never watch, and skip its lock.
    watching: AtomicBool,
    watched: Mutex<Watched>,
}

/// Sessions watched from a moment on, and when a request of one of them sent after it was
/// first answered with success.
#[derive(Debug, Default)]
struct Watched {
    since: Option<Instant>,
    sessions: HashSet<String>,
    first_served: Option<Instant>,
}

impl Answers {
    /// Notes the answer `status` to a request sent at `sent` with `headers`.
    fn saw(&self, status: StatusCode, headers: &[(&str, &str)], sent: Instant) {
        if status == StatusCode::SERVICE_UNAVAILABLE {
            self.unavailable.fetch_add(1, Ordering::Relaxed);
        }
        if !status.is_success() || !self.watching.load(Ordering::Relaxed) {
            return;
        }
        let Some((_, session)) = headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("mcp-session-id"))
        else {
            return;
        };
        let mut watched = self.watched.lock().unwrap_or_else(PoisonError::into_inner);
        if watched.since.is_some_and(|since| sent >= since)
            && watched.first_served.is_none()
            && watched.sessions.contains(*session)
        {
            watched.first_served = Some(Instant::now());
        }
    }
}

impl HeadWaits {
    /// Describes a request answered late (`headers` as sent), while fewer than
    /// [`MAX_LATE_DESCRIBED`] are.
    fn describe_late(
        &self,
        method: &Method,
        url: &str,
        headers: &[(&str, &str)],
        waited: Duration,
    ) {
        let header = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| (*v).to_owned())
        };
        let mut described = self
            .described
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if described.len() < MAX_LATE_DESCRIBED {
            described.push(LateRequest {
                session: header("mcp-session-id"),
                detail: format!(
                    "{method} {url} (Last-Event-ID {}): response headers after {:.1} s",
                    header("last-event-id").as_deref().unwrap_or("none"),
                    waited.as_secs_f64()
                ),
            });
        }
    }
}

/// A request answered after [`LATE_HEAD`] or more.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LateRequest {
    /// Its `Mcp-Session-Id`, if it had one.
    pub session: Option<String>,
    /// Method, URL, `Last-Event-ID` and how long its headers took.
    pub detail: String,
}

impl Default for Http {
    fn default() -> Self {
        Self::new()
    }
}

impl Http {
    /// A new client.
    pub fn new() -> Self {
        Self::connecting_from(None, Arc::default())
    }

    /// A new client whose connections leave from `source` (a loopback address: a client pod of
    /// its own, as a pod's per-source connection bounds see it).
    pub fn from_source(source: IpAddr) -> Self {
        Self::connecting_from(Some(source), Arc::default())
    }

    fn connecting_from(source: Option<IpAddr>, heads: Arc<HeadWaits>) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        connector.set_local_address(source);
        Self {
            client: Client::builder(TokioExecutor::new()).build(connector),
            heads,
        }
    }

    /// The requests of this client and its clones answered after [`LATE_HEAD`] or more (the
    /// first [`MAX_LATE_DESCRIBED`]).
    pub fn late_requests(&self) -> Vec<LateRequest> {
        self.heads
            .described
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Requests of this client and its clones whose response headers took [`LATE_HEAD`] or
    /// more (those that never came included), and the longest wait of any.
    pub fn late_heads(&self) -> (u64, Duration) {
        (
            self.heads.late.load(Ordering::Relaxed),
            Duration::from_millis(self.heads.longest_ms.load(Ordering::Relaxed)),
        )
    }

    /// Sends a request with `headers` and an optional body.
    ///
    /// # Errors
    /// [`HarnessError::Connection`] when the connection fails before any response headers;
    /// [`HarnessError::Http`] when no response headers arrive within [`RESPONSE_TIMEOUT`] (a
    /// test never waits for ever on a server that does not answer).
    pub async fn send(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: Option<Bytes>,
    ) -> Result<Response<Incoming>> {
        let mut req = Request::builder().method(method).uri(url);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let req = req
            .body(Full::new(body.unwrap_or_default()))
            .map_err(|e| HarnessError::Http(e.to_string()))?;
        let method = req.method().clone();
        let host = req.uri().host().unwrap_or("unknown").to_owned();
        let sent = std::time::Instant::now();
        let answered = tokio::time::timeout(RESPONSE_TIMEOUT, self.client.request(req)).await;
        let waited = sent.elapsed();
        if let Ok(Ok(resp)) = &answered {
            self.heads.answers.saw(resp.status(), headers, sent);
        }
        if waited >= LATE_HEAD {
            self.heads.late.fetch_add(1, Ordering::Relaxed);
            if answered.is_ok() {
                self.heads.describe_late(&method, url, headers, waited);
            }
        }
        let waited_ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
        self.heads
            .longest_ms
            .fetch_max(waited_ms, Ordering::Relaxed);
        answered
            .map_err(|_| {
                HarnessError::Http(format!(
                    "{method} {url}: no response headers within {RESPONSE_TIMEOUT:?}"
                ))
            })?
            .map_err(|e| HarnessError::Connection(format!("{url}: {e}")))
            .map(|mut resp| {
                resp.extensions_mut().insert(AnsweredBy(host));
                resp
            })
    }

    /// GET `url`, returning status and body text.
    ///
    /// # Errors
    /// [`HarnessError::Http`] when the exchange fails.
    pub async fn get_text(&self, url: &str) -> Result<(StatusCode, String)> {
        let resp = self.send(Method::GET, url, &[], None).await?;
        let status = resp.status();
        Ok((status, body_text(resp).await?))
    }
}

/// Reads a whole body as text.
///
/// # Errors
/// [`HarnessError::Http`] when the body breaks.
pub async fn body_text(resp: Response<Incoming>) -> Result<String> {
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| HarnessError::Http(e.to_string()))?
        .to_bytes();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// A session as the client knows it.
#[derive(Clone, Debug)]
pub struct Session {
    /// `Mcp-Session-Id` from the `initialize` response.
    pub id: String,
    /// The negotiated protocol version.
    pub version: String,
}

impl Session {
    /// This session with byte `at` of its id changed (`A` ↔ `B`): a well-formed id no pod
    /// issued, whose signature does not match.
    pub fn forged(&self, at: usize) -> Self {
        let mut id = self.id.clone().into_bytes();
        id[at] = if id[at] == b'A' { b'B' } else { b'A' };
        Self {
            id: String::from_utf8_lossy(&id).into_owned(),
            version: self.version.clone(),
        }
    }
}

/// An MCP client of one endpoint: one URL, or several pods' URLs of which every request picks
/// one at random (a Service without affinity in front of the pods). The set of entry URLs is
/// shared by every clone and can change ([`McpClient::set_entries`]), as a Service's endpoints
/// do during a rollout.
#[derive(Clone, Debug)]
pub struct McpClient {
    http: Http,
    /// The MCP endpoint, e.g. `http://127.0.0.1:8080/mcp` (the first of several at creation).
    pub url: String,
    entries: Arc<RwLock<Vec<String>>>,
    honour_retry_after: bool,
    /// Waits before each new attempt of a request whose connection failed before any answer
    /// ([`McpClient::reconnecting`]); none by default.
    reconnects: &'static [Duration],
    /// Requests sent again after a failed connection, by this client and its clones.
    reconnected: Arc<AtomicU64>,
    /// `Authorization` of every request of this client and its clones, unless a request sets
    /// its own ([`McpClient::set_authorization`]).
    authorization: Arc<RwLock<Option<String>>>,
    /// This client's own refreshed tokens ([`McpClient::with_tokens`]).
    tokens: Option<Arc<Tokens>>,
    /// Headers of every request of this client and its clones, unless a request sets its own
    /// ([`McpClient::set_headers`]).
    headers: Arc<RwLock<Vec<(String, String)>>>,
}

/// The public name clients reach a test endpoint by and the browser `Origin` it allows
/// (`PodSpec::default`), as a browser client behind a load balancer sends them
/// ([`McpClient::set_headers`]).
pub const PUBLIC_HEADERS: [(&str, &str); 2] = [
    ("host", "mcp.example.com"),
    ("origin", "https://app.example.com"),
];

/// Most times a client honouring `Retry-After` sends a request answered 429/503: enough to
/// outwait a lost pod's detection (5 s by default, `Retry-After: 1` each time), so that the
/// 503s of a failover are what the client sees of it, not an error.
const RETRY_AFTER_ATTEMPTS: u32 = 10;
/// Longest wait it takes from one `Retry-After`.
const RETRY_AFTER_CAP: Duration = Duration::from_secs(2);

/// When a client that reconnects ([`McpClient::reconnecting`]) sends a request again after its
/// connection failed before any answer: the schedule on which the TypeScript SDK reconnects a
/// stream (2 more attempts, 1 s and then 1.5 s later).
const RECONNECT_DELAYS: [Duration; 2] = [Duration::from_millis(1000), Duration::from_millis(1500)];

/// The SSE events of a response.
pub struct Events {
    inner: Pin<Box<dyn Stream<Item = std::result::Result<Sse, sse_stream::Error>> + Send>>,
    pod: String,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events")
            .field("pod", &self.pod)
            .finish_non_exhaustive()
    }
}

impl Events {
    /// The events of `resp` (which must be `text/event-stream`).
    pub fn new(resp: Response<Incoming>) -> Self {
        let pod = resp
            .extensions()
            .get::<AnsweredBy>()
            .map_or_else(|| "unknown".to_owned(), |by| format!("pod {}", by.0));
        Self {
            inner: Box::pin(SseStream::new(resp.into_body())),
            pod,
        }
    }

    /// The pod these events come from (`pod <host>`, the name of its sidecar log in a run's
    /// report; `unknown` for a response not sent by [`Http::send`]).
    pub fn pod(&self) -> &str {
        &self.pod
    }

    /// The next event; `None` when the stream ended or broke.
    pub async fn next(&mut self) -> Option<Sse> {
        match self.inner.next().await {
            Some(Ok(ev)) => Some(ev),
            _ => None,
        }
    }

    /// The next event within `within`; `None` when the stream ended, broke or stalled.
    pub async fn next_within(&mut self, within: Duration) -> Option<Sse> {
        tokio::time::timeout(within, self.next())
            .await
            .ok()
            .flatten()
    }

    /// The events the stream still carries until it ends.
    ///
    /// # Errors
    /// [`HarnessError::Protocol`] when it stalls for `within` before its end.
    pub async fn rest(&mut self, within: Duration) -> Result<Vec<Sse>> {
        let mut out = Vec::new();
        loop {
            match tokio::time::timeout(within, self.next()).await {
                Ok(Some(ev)) => out.push(ev),
                Ok(None) => return Ok(out),
                Err(_) => {
                    return Err(HarnessError::Protocol(format!(
                        "the stream stalled after {out:?}"
                    )));
                }
            }
        }
    }
}

/// Whether a response is SSE.
pub fn is_sse<B>(resp: &Response<B>) -> bool {
    resp.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// The JSON-RPC messages of a response: its JSON body, or the data of its SSE events (priming
/// events skipped), read until the stream ends or stalls for `within`.
///
/// # Errors
/// [`HarnessError::Protocol`] for a body that is not JSON.
pub async fn messages(resp: Response<Incoming>, within: Duration) -> Result<Vec<Value>> {
    if is_sse(&resp) {
        let mut events = Events::new(resp);
        let mut out = Vec::new();
        while let Some(ev) = events.next_within(within).await {
            if let Some(data) = ev.data.filter(|d| !d.is_empty()) {
                out.push(parse(&data)?);
            }
        }
        Ok(out)
    } else {
        let text = body_text(resp).await?;
        if text.is_empty() {
            return Ok(Vec::new());
        }
        Ok(vec![parse(&text)?])
    }
}

/// `text` as JSON, or a [`HarnessError::Protocol`] quoting it.
pub(crate) fn parse(text: &str) -> Result<Value> {
    serde_json::from_str(text)
        .map_err(|e| HarnessError::Protocol(format!("not JSON ({e}): {text:.200}")))
}

/// The body of an `initialize` request for `version`.
pub fn initialize_body(id: u64, version: &str) -> Value {
    json!({
        "jsonrpc": "2.0", "id": id, "method": "initialize",
        "params": {
            "protocolVersion": version,
            "capabilities": {},
            "clientInfo": {"name": "tether-tests", "version": "0"}
        }
    })
}

/// The body of a `tools/list` request.
pub fn tools_list(id: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"})
}

/// The body of a `tools/call` request, with `progress_token` in `_meta` when given.
pub fn tool_call(id: u64, name: &str, arguments: Value, progress_token: Option<&str>) -> Value {
    let mut params = json!({"name": name, "arguments": arguments});
    if let Some(token) = progress_token {
        params["_meta"] = json!({"progressToken": token});
    }
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
}

impl McpClient {
    /// A client of the MCP endpoint at `url`.
    pub fn new(url: impl Into<String>) -> Self {
        Self::spread(vec![url.into()])
    }

    /// A client whose every request enters at a random one of `urls` (at least one).
    pub fn spread(urls: Vec<String>) -> Self {
        Self {
            http: Http::new(),
            url: urls.first().cloned().unwrap_or_default(),
            entries: Arc::new(RwLock::new(urls)),
            honour_retry_after: false,
            reconnects: &[],
            reconnected: Arc::default(),
            authorization: Arc::default(),
            tokens: None,
            headers: Arc::default(),
        }
    }

    /// A clone of this client (sharing its entries, credentials and headers) whose connections
    /// leave from `source`, with a connection pool of their own ([`Http::from_source`]).
    pub fn from_source(&self, source: IpAddr) -> Self {
        Self {
            http: Http::connecting_from(Some(source), Arc::clone(&self.http.heads)),
            ..self.clone()
        }
    }

    /// Sends `authorization` (e.g. `Bearer <token>`) with every later request of this client
    /// and of all its clones; `None` sends none. A refreshed token replaces the old one.
    pub fn set_authorization(&self, authorization: Option<String>) {
        *self
            .authorization
            .write()
            .unwrap_or_else(PoisonError::into_inner) = authorization;
    }

    /// Sends `headers` with every later request of this client and of all its clones (a request
    /// that sets one of them sends its own), replacing the ones set before: e.g. the public
    /// `Host` and the browser `Origin` of a client behind a load balancer. `hyper` adds `Host`
    /// from the URL only when none is set.
    pub fn set_headers(&self, headers: &[(&str, &str)]) {
        *self.headers.write().unwrap_or_else(PoisonError::into_inner) = headers
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect();
    }

    /// This client (not the clones made before) with its own bearer tokens: every request
    /// carries `tokens`' current one (refreshed before expiry when they say so), and a request
    /// answered 401 is sent once more with a fresh token, as OAuth clients do. Overrides
    /// [`McpClient::set_authorization`].
    pub fn with_tokens(mut self, tokens: Arc<Tokens>) -> Self {
        self.tokens = Some(tokens);
        self
    }

    /// This client, sending a request answered 429 or 503 with `Retry-After` again after the
    /// wait it names (at most `RETRY_AFTER_CAP`, `RETRY_AFTER_ATTEMPTS` times), as a
    /// well-behaved MCP client does during a rollout.
    pub fn honouring_retry_after(mut self) -> Self {
        self.honour_retry_after = true;
        self
    }

    /// This client, sending a request again (to a fresh entry) when its connection failed before
    /// any response headers (refused, reset: not a timeout), on the schedule MCP SDKs reconnect
    /// a stream on (`RECONNECT_DELAYS`): what a client does when the pod its connection went to
    /// was lost. A resume (GET) is what SDKs send again; a POST sent again (same id and body) is
    /// tether's retry, which attaches to the running request or replays its answer, and which an
    /// SDK leaves to its application. Counted ([`McpClient::reconnected`]).
    pub fn reconnecting(mut self) -> Self {
        self.reconnects = &RECONNECT_DELAYS;
        self
    }

    /// Requests this client and its clones sent again after a failed connection.
    pub fn reconnected(&self) -> u64 {
        self.reconnected.load(Ordering::Relaxed)
    }

    /// Sends a request to an entry; with [`McpClient::honouring_retry_after`], again after a
    /// 429/503 that carries `Retry-After` (each time to a fresh entry); with
    /// [`McpClient::with_tokens`], once more with a fresh token after a 401.
    async fn send(
        &self,
        method: Method,
        headers: &[(&str, &str)],
        body: Option<Bytes>,
    ) -> Result<Response<Incoming>> {
        self.send_via(None, method, headers, body).await
    }

    /// Sends a request to `url` (not a random entry) with this client's credentials and
    /// headers, as every request of the client is sent (a fresh token after a 401, `Retry-After`
    /// honoured when asked).
    ///
    /// # Errors
    /// [`HarnessError::Http`] when the exchange fails.
    pub async fn send_at(
        &self,
        url: &str,
        method: Method,
        headers: &[(&str, &str)],
        body: Option<Bytes>,
    ) -> Result<Response<Incoming>> {
        self.send_via(Some(url), method, headers, body).await
    }

    async fn send_via(
        &self,
        url: Option<&str>,
        method: Method,
        headers: &[(&str, &str)],
        body: Option<Bytes>,
    ) -> Result<Response<Incoming>> {
        let mut authorization = match &self.tokens {
            Some(tokens) => Some(tokens.authorization()),
            None => self
                .authorization
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        };
        let defaults = self
            .headers
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let set = |name: &str| headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name));
        let mut attempt = 1;
        let mut refreshed = false;
        let mut reconnects = self.reconnects.iter();
        loop {
            let mut all = headers.to_vec();
            if let Some(value) = &authorization
                && !set("authorization")
            {
                all.push(("authorization", value));
            }
            all.extend(
                defaults
                    .iter()
                    .filter(|(name, _)| !set(name))
                    .map(|(name, value)| (name.as_str(), value.as_str())),
            );
            let sent = self
                .http
                .send(
                    method.clone(),
                    &url.map_or_else(|| self.entry(), str::to_owned),
                    &all,
                    body.clone(),
                )
                .await;
            let resp = match sent {
                Ok(resp) => resp,
                Err(HarnessError::Connection(e)) => match reconnects.next() {
                    Some(&wait) => {
                        self.reconnected.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(wait).await;
                        continue;
                    }
                    None => return Err(HarnessError::Connection(e)),
                },
                Err(e) => return Err(e),
            };
            if let (Some(tokens), Some(sent)) = (&self.tokens, &authorization)
                && resp.status() == StatusCode::UNAUTHORIZED
                && !refreshed
                && !set("authorization")
            {
                // As an OAuth client does: a fresh token, and the same request once more.
                authorization = Some(tokens.refused(sent));
                refreshed = true;
                continue;
            }
            match crate::follow::retry_after(&resp) {
                Some(secs) if self.honour_retry_after && attempt < RETRY_AFTER_ATTEMPTS => {
                    tokio::time::sleep(Duration::from_secs(secs).min(RETRY_AFTER_CAP)).await;
                    attempt += 1;
                    if let Some(tokens) = &self.tokens {
                        // The token may have come near its expiry while the client waited.
                        authorization = Some(tokens.authorization());
                    }
                }
                _ => return Ok(resp),
            }
        }
    }

    /// Replaces the entry URLs of this client and of all its clones; requests already sent
    /// (and their open streams) keep their connection. An empty set falls back to
    /// [`McpClient::url`].
    pub fn set_entries(&self, urls: Vec<String>) {
        *self.entries.write().unwrap_or_else(PoisonError::into_inner) = urls;
    }

    /// Requests of this client and its clones whose response headers took
    /// [`LATE_HEAD`] or more, and the longest wait ([`Http::late_heads`]).
    pub fn late_heads(&self) -> (u64, Duration) {
        self.http.late_heads()
    }

    /// The requests of this client and its clones answered late ([`Http::late_requests`]).
    pub fn late_requests(&self) -> Vec<LateRequest> {
        self.http.late_requests()
    }

    /// Answers 503 to this client and its clones so far (each attempt of a request sent again
    /// after its `Retry-After` counts).
    pub fn unavailable(&self) -> u64 {
        self.http.heads.answers.unavailable.load(Ordering::Relaxed)
    }

    /// Watches `sessions` from `since` on: [`McpClient::first_served`] is then when a request of
    /// one of them sent at `since` or later was first answered with success, by this client or
    /// a clone (e.g. the sessions of a pod lost at `since`: when one was served again).
    pub fn watch_sessions(&self, since: Instant, sessions: HashSet<String>) {
        let answers = &self.http.heads.answers;
        *answers
            .watched
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Watched {
            since: Some(since),
            sessions,
            first_served: None,
        };
        answers.watching.store(true, Ordering::Relaxed);
    }

    /// When a request of a session [`McpClient::watch_sessions`] watches was first served.
    pub fn first_served(&self) -> Option<Instant> {
        let answers = &self.http.heads.answers;
        let watched = answers
            .watched
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        watched.first_served
    }

    /// The entry URL of the next request.
    pub fn entry(&self) -> String {
        let entries = self.entries.read().unwrap_or_else(PoisonError::into_inner);
        match entries.len() {
            0 => self.url.clone(),
            n => entries[rand::random_range(0..n)].clone(),
        }
    }

    /// The underlying HTTP client.
    pub fn http(&self) -> &Http {
        &self.http
    }

    /// POSTs `body` with the standard headers (and the session's, when given) plus `extra`.
    ///
    /// # Errors
    /// [`HarnessError::Http`] when the exchange fails.
    pub async fn post(
        &self,
        session: Option<&Session>,
        body: &Value,
        extra: &[(&str, &str)],
    ) -> Result<Response<Incoming>> {
        let mut headers = vec![
            ("accept", ACCEPT_BOTH),
            ("content-type", "application/json"),
        ];
        if let Some(s) = session {
            headers.push(("mcp-session-id", &s.id));
            headers.push(("mcp-protocol-version", &s.version));
        }
        headers.extend_from_slice(extra);
        self.send(Method::POST, &headers, Some(Bytes::from(body.to_string())))
            .await
    }

    /// POSTs `body` (in `session`, when given) with the standard headers: the answer's status
    /// and whole body as text.
    ///
    /// # Errors
    /// [`HarnessError::Http`] when the exchange fails or the body does not arrive.
    pub async fn post_text(
        &self,
        session: Option<&Session>,
        body: &Value,
    ) -> Result<(StatusCode, String)> {
        let resp = self.post(session, body, &[]).await?;
        let status = resp.status();
        Ok((status, body_text(resp).await?))
    }

    /// GET on the endpoint for `session`, resuming after `last_event_id` when given.
    ///
    /// # Errors
    /// [`HarnessError::Http`] when the exchange fails.
    pub async fn get(
        &self,
        session: &Session,
        last_event_id: Option<&str>,
    ) -> Result<Response<Incoming>> {
        let mut headers = vec![
            ("accept", "text/event-stream"),
            ("mcp-session-id", session.id.as_str()),
            ("mcp-protocol-version", session.version.as_str()),
        ];
        if let Some(id) = last_event_id {
            headers.push(("last-event-id", id));
        }
        self.send(Method::GET, &headers, None).await
    }

    /// Opens `session`'s standalone stream (GET without `Last-Event-ID`): its events.
    ///
    /// # Errors
    /// [`HarnessError::Status`] for an answer other than 200 SSE; [`HarnessError::Http`] when
    /// the exchange fails.
    pub async fn standalone(&self, session: &Session) -> Result<Events> {
        let resp = self.get(session, None).await?;
        if resp.status() != StatusCode::OK || !is_sse(&resp) {
            return Err(unexpected("the standalone GET", resp).await);
        }
        Ok(Events::new(resp))
    }

    /// DELETE the session; returns the status.
    ///
    /// # Errors
    /// [`HarnessError::Http`] when the exchange fails.
    pub async fn delete(&self, session: &Session) -> Result<StatusCode> {
        let headers = [
            ("mcp-session-id", session.id.as_str()),
            ("mcp-protocol-version", session.version.as_str()),
        ];
        let resp = self.send(Method::DELETE, &headers, None).await?;
        Ok(resp.status())
    }

    /// `initialize` (asking for `version`) then `notifications/initialized`.
    ///
    /// # Errors
    /// [`HarnessError::Protocol`] when the server does not answer as the spec says.
    pub async fn initialize(&self, version: &str) -> Result<Session> {
        Ok(self.initialize_placed(version).await?.0)
    }

    /// [`McpClient::initialize`], and the pod that answered the `initialize` (its host): where
    /// the session was created, and is held until it moves.
    ///
    /// # Errors
    /// [`HarnessError::Protocol`] when the server does not answer as the spec says.
    pub async fn initialize_placed(&self, version: &str) -> Result<(Session, String)> {
        let resp = self.post(None, &initialize_body(1, version), &[]).await?;
        if resp.status() != StatusCode::OK {
            return Err(unexpected("initialize", resp).await);
        }
        let pod = resp
            .extensions()
            .get::<AnsweredBy>()
            .map_or_else(String::new, |by| by.0.clone());
        let id = resp
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .ok_or_else(|| {
                HarnessError::Protocol("initialize answered without Mcp-Session-Id".into())
            })?;
        let messages = messages(resp, Duration::from_secs(10)).await?;
        let negotiated = messages
            .iter()
            .find_map(|m| m.pointer("/result/protocolVersion").and_then(Value::as_str))
            .ok_or_else(|| HarnessError::Protocol(format!("no initialize result in {messages:?}")))?
            .to_owned();
        let session = Session {
            id,
            version: negotiated,
        };
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let resp = self.post(Some(&session), &initialized, &[]).await?;
        if resp.status() != StatusCode::ACCEPTED {
            return Err(unexpected("notifications/initialized", resp).await);
        }
        Ok((session, pod))
    }

    /// Posts a `tools/call` of `name` with `arguments` (request id `id`): its answer, which the
    /// caller reads (SSE or JSON).
    ///
    /// # Errors
    /// [`HarnessError`] when the POST fails or is not answered 200.
    pub async fn post_call(
        &self,
        session: &Session,
        id: u64,
        name: &str,
        arguments: Value,
    ) -> Result<Response<Incoming>> {
        let resp = self
            .post(Some(session), &tool_call(id, name, arguments, None), &[])
            .await?;
        if resp.status() != StatusCode::OK {
            return Err(unexpected(&format!("tools/call {name}"), resp).await);
        }
        Ok(resp)
    }

    /// Calls the `echo` tool with `text` (request id `id`): `Ok` when answered 200 within
    /// `within` with a result carrying `text`.
    ///
    /// # Errors
    /// [`HarnessError::Status`] for any other answer, [`HarnessError::Http`] when the exchange
    /// fails or takes longer than `within`.
    pub async fn echo(
        &self,
        session: &Session,
        id: u64,
        text: &str,
        within: Duration,
    ) -> Result<()> {
        let call = tool_call(id, "echo", json!({"text": text}), None);
        let (status, body) = tokio::time::timeout(within, self.post_text(Some(session), &call))
            .await
            .map_err(|_| HarnessError::Http(format!("echo: no answer within {within:?}")))??;
        if status == StatusCode::OK && body.contains(r#""result""#) && body.contains(text) {
            Ok(())
        } else {
            Err(HarnessError::Status {
                what: "echo".to_owned(),
                status,
                body,
            })
        }
    }

    /// Calls a tool and returns all messages of the answer.
    ///
    /// # Errors
    /// [`HarnessError`] when the exchange fails.
    pub async fn call(
        &self,
        session: &Session,
        id: u64,
        name: &str,
        arguments: Value,
    ) -> Result<Vec<Value>> {
        let resp = self.post_call(session, id, name, arguments).await?;
        messages(resp, Duration::from_secs(30)).await
    }
}

/// [`HarnessError::Status`] for `resp`, an answer of exchange `what` with an unexpected status.
pub async fn unexpected(what: &str, resp: Response<Incoming>) -> HarnessError {
    let status = resp.status();
    HarnessError::Status {
        what: what.to_owned(),
        status,
        body: body_text(resp).await.unwrap_or_default(),
    }
}

/// The text of a `tools/call` result message (`result.content[0].text`).
pub fn result_text(message: &Value) -> Option<&str> {
    message
        .pointer("/result/content/0/text")
        .and_then(Value::as_str)
}

/// A header value of a response, as text.
pub fn header_str<B>(resp: &Response<B>, name: &str) -> Option<String> {
    resp.headers()
        .get(name)
        .map(HeaderValue::as_bytes)
        .map(|b| String::from_utf8_lossy(b).into_owned())
}

/// The `data.reason` of a JSON-RPC error, wherever one stands in `text` (a message, an error
/// answer's body, a failure that quotes one, cut short or not): how a sidecar says why it ended
/// or refused a request.
pub fn error_reason(text: &str) -> Option<&str> {
    let (_, after) = text.split_once("\"error\"")?;
    let (_, after) = after.split_once("\"reason\"")?;
    let value = after.trim_start().strip_prefix(':')?.trim_start();
    let value = value.strip_prefix('"')?;
    value.split_once('"').map(|(reason, _)| reason)
}

/// The JSON-RPC error object of an error answer, with its status. Such answers are
/// `application/json` and never carry a session id.
///
/// # Errors
/// [`HarnessError::Protocol`] naming what differs.
pub async fn json_error(resp: Response<Incoming>) -> Result<(StatusCode, Value)> {
    let status = resp.status();
    let content_type = header_str(&resp, "content-type");
    let session_header = resp.headers().contains_key("mcp-session-id");
    let body = body_text(resp).await?;
    let error = serde_json::from_str::<Value>(&body)
        .ok()
        .and_then(|v| v.get("error").cloned())
        .filter(|_| content_type.as_deref() == Some("application/json") && !session_header);
    error.map(|e| (status, e)).ok_or_else(|| {
        HarnessError::Protocol(format!(
            "{status} is not a JSON-RPC error without a session id \
             (content-type {content_type:?}, session header {session_header}): {body:.300}"
        ))
    })
}

/// Checks that `resp` is a JSON-RPC error answer ([`json_error`]) with `status` and
/// `data.reason` = `reason`; returns the error object.
///
/// # Errors
/// [`HarnessError::Protocol`] naming what differs.
pub async fn expect_error(
    resp: Response<Incoming>,
    status: StatusCode,
    reason: &str,
) -> Result<Value> {
    let (got, error) = json_error(resp).await?;
    if got == status && error["data"]["reason"] == reason {
        Ok(error)
    } else {
        Err(HarnessError::Protocol(format!(
            "expected {status} {reason}, got {got}: {error}"
        )))
    }
}

/// Checks that `resp` is the 404 of a lost session (spec S-05, S-06): JSON-RPC error -32001
/// with `data.reason` = `session_not_found`.
///
/// # Errors
/// [`HarnessError::Protocol`] naming what differs.
pub async fn expect_lost_session(resp: Response<Incoming>) -> Result<()> {
    let error = expect_error(resp, StatusCode::NOT_FOUND, "session_not_found").await?;
    if error["code"] == -32001 {
        Ok(())
    } else {
        Err(HarnessError::Protocol(format!(
            "expected the 404 of a lost session (-32001), got {error}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_request_is_described_with_its_session_and_cursor_and_the_rest_counted() {
        let waits = HeadWaits::default();
        let headers = [("Mcp-Session-Id", "sid-1"), ("last-event-id", "abc-3")];
        for _ in 0..=MAX_LATE_DESCRIBED {
            waits.describe_late(&Method::GET, "http://p/mcp", &headers, LATE_HEAD);
        }
        let described = waits.described.lock().unwrap();
        assert_eq!(described.len(), MAX_LATE_DESCRIBED);
        assert_eq!(described[0].session.as_deref(), Some("sid-1"));
        assert_eq!(
            described[0].detail,
            "GET http://p/mcp (Last-Event-ID abc-3): response headers after 10.0 s"
        );
    }

    #[test]
    fn a_watched_session_is_first_served_by_a_success_sent_after_the_watch_began() {
        let client = McpClient::new("http://127.0.0.1:1/mcp");
        let answers = &client.http.heads.answers;
        let before = Instant::now();
        let since = Instant::now();
        client.watch_sessions(since, ["sid-1".to_owned()].into());
        let of = |sid| [("mcp-session-id", sid)];
        answers.saw(StatusCode::OK, &of("sid-1"), before);
        answers.saw(StatusCode::OK, &of("sid-2"), since);
        answers.saw(StatusCode::SERVICE_UNAVAILABLE, &of("sid-1"), since);
        assert_eq!((client.first_served(), client.unavailable()), (None, 1));
        answers.saw(StatusCode::OK, &of("sid-1"), since);
        assert!(client.first_served().is_some_and(|at| at >= since));
    }

    #[test]
    fn the_reason_of_an_error_is_found_in_a_message_a_body_or_a_failure() {
        let message = r#"{"jsonrpc":"2.0","id":3,"error":{"code":-32603,"message":"x","data":{"reason":"handoff_interrupted"}}}"#;
        assert_eq!(error_reason(message), Some("handoff_interrupted"));
        let failure = r#"resume after k-3 answered 503 Service Unavailable: {"jsonrpc":"2.0","error":{"code":-32000,"data": {"reason" : "holder_lost"}}"#;
        assert_eq!(error_reason(failure), Some("holder_lost"));
        assert_eq!(error_reason(r#"{"result":{"reason":"no"}}"#), None);
        assert_eq!(error_reason("stream ended without a result"), None);
    }
}
