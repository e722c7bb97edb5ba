//! Component tests of the broker, in process: a real [`Broker`] in front of a fake MCP server
//! ([`FakeMcp`], a hyper server on `127.0.0.1:0` in the test's runtime), driven through
//! [`Broker::handle`] with requests that passed the real admission. Each test checks what a
//! client is answered and what the MCP server received: a session created once, a call's
//! events numbered and replayed after a cursor, a retry that never runs its tool twice, a
//! reused id refused, a deleted session gone, the bound of calls in flight per session
//! (`docs/design/buffering.md#retries`, `docs/design/architecture.md#bounds`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tether_crds::{AuthBinding, Migration, ProtocolVersion};
use tokio::sync::watch;

use super::{Broker, BrokerConfig, CallLimits, TaskLimits};
use crate::broker::metrics::BrokerMetrics;
use crate::keys::KeyRing;
use crate::mcp::admission::{Admission, AdmissionPolicy};
use crate::mcp::cursor::EventId;
use crate::mcp::headers::{LAST_EVENT_ID, MCP_PROTOCOL_VERSION, MCP_SESSION_ID};
use crate::mcp::home::HomeToken;
use crate::mcp::jsonrpc::{Body, EnvelopeLimits, RequestKey};
use crate::mcp::origin::OriginPolicy;
use crate::mcp::session_id::IdMinter;
use crate::reply::{Reply, ReplyBody};
use crate::retained::Retained;
use crate::session::{Registry, RetryWindow, Session};
use crate::stream::FeedItem;
use crate::stream::buffer::BufferLimits;
use crate::upstream::{Upstream, events};

/// The version every session of these tests negotiates (no priming events).
const VERSION: ProtocolVersion = ProtocolVersion::V2025_06_18;

/// The bound of calls in flight per session (`--max-session-calls`).
const SESSION_CALLS: usize = 2;

/// The progress notifications each tool call streams before its result.
const PROGRESS: u64 = 3;

/// An MCP server speaking Streamable HTTP, in the test's runtime: `initialize` opens an upstream
/// session (`upstream-<n>`, JSON answer), notifications get 202, `tools/call` (of any tool)
/// streams [`PROGRESS`] progress notifications at once then, once [`FakeMcp::release`] was
/// called, its result, as SSE, each event in its own body frame; `DELETE` answers 200 and `GET`
/// 405. It records every request it received.
struct FakeMcp {
    addr: SocketAddr,
    state: Arc<FakeState>,
}

#[derive(Debug)]
struct FakeState {
    /// What was received, in order: `initialize`, `notifications/initialized`,
    /// `tools/call <id>`, `DELETE <upstream session>`.
    received: Mutex<Vec<String>>,
    /// Whether held results may be sent.
    released: watch::Sender<bool>,
}

type FakeBody = BoxBody<Bytes, Infallible>;

impl FakeMcp {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(FakeState {
            received: Mutex::default(),
            released: watch::Sender::new(false),
        });
        let serving = Arc::clone(&state);
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let state = Arc::clone(&serving);
                let service = service_fn(move |req| answer(Arc::clone(&state), req));
                tokio::spawn(http1::Builder::new().serve_connection(TokioIo::new(tcp), service));
            }
        });
        Self { addr, state }
    }

    /// How many requests the server received under `label` (e.g. `tools/call 7`).
    fn received(&self, label: &str) -> usize {
        self.state
            .received
            .lock()
            .iter()
            .filter(|l| *l == label)
            .count()
    }

    /// Lets the results of calls go, now and from now on.
    fn release(&self) {
        self.state.released.send_replace(true);
    }
}

/// The fake's answer to `req`.
async fn answer(
    state: Arc<FakeState>,
    req: Request<Incoming>,
) -> Result<Response<FakeBody>, Infallible> {
    let session = req
        .headers()
        .get(MCP_SESSION_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let record = |label: String| {
        let mut received = state.received.lock();
        received.push(label);
        received.len()
    };
    match *req.method() {
        Method::POST => {}
        Method::DELETE => {
            record(format!("DELETE {session}"));
            return Ok(empty(StatusCode::OK));
        }
        _ => return Ok(empty(StatusCode::METHOD_NOT_ALLOWED)),
    }
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let message: Value = serde_json::from_slice(&body).unwrap();
    let id = message["id"].clone();
    match message["method"].as_str().unwrap_or_default() {
        "initialize" => {
            let n = record("initialize".into());
            let result = json!({"jsonrpc": "2.0", "id": id, "result": {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "fake", "version": "1"},
            }});
            let mut resp = Response::new(Full::new(Bytes::from(result.to_string())).boxed());
            let headers = resp.headers_mut();
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            headers.insert(MCP_SESSION_ID, format!("upstream-{n}").parse().unwrap());
            Ok(resp)
        }
        "tools/call" => {
            record(format!("tools/call {id}"));
            let mut released = state.released.subscribe();
            let progress: Vec<Value> = (1..=PROGRESS)
                .map(|i| {
                    json!({"jsonrpc": "2.0", "method": "notifications/progress",
                           "params": {"progressToken": id, "progress": i, "total": PROGRESS}})
                })
                .collect();
            let result = futures::stream::once(async move {
                // The sender lives as long as the server's state.
                released.wait_for(|go| *go).await.unwrap();
                json!({"jsonrpc": "2.0", "id": id,
                       "result": {"content": [{"type": "text", "text": "done"}]}})
            });
            let frames = futures::stream::iter(progress)
                .chain(result)
                .map(|message| {
                    let event = format!("event: message\ndata: {message}\n\n");
                    Ok::<_, Infallible>(Frame::data(Bytes::from(event)))
                });
            let mut resp = Response::new(BodyExt::boxed(StreamBody::new(frames)));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            );
            Ok(resp)
        }
        // Two pages: one JSON answer, then one SSE event.
        "tools/list" => {
            record("tools/list".into());
            let (tools, next) = match message["params"]["cursor"].as_str() {
                None => (
                    json!([{"name": "search", "annotations": {"readOnlyHint": true}},
                           {"name": "progress"}]),
                    Some("2"),
                ),
                Some(_) => (
                    json!([{"name": "lookup", "annotations": {"readOnlyHint": true}},
                           {"name": "upsert", "annotations": {"idempotentHint": true}}]),
                    None,
                ),
            };
            let answer = json!({"jsonrpc": "2.0", "id": id,
                                "result": {"tools": tools, "nextCursor": next}});
            let (body, content_type) = if next.is_some() {
                (answer.to_string(), "application/json")
            } else {
                (
                    format!("event: message\ndata: {answer}\n\n"),
                    "text/event-stream",
                )
            };
            let mut resp = Response::new(Full::new(Bytes::from(body)).boxed());
            resp.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
            Ok(resp)
        }
        // A notification (the tests send no other request).
        _ => {
            record(message["method"].as_str().unwrap_or_default().to_owned());
            Ok(empty(StatusCode::ACCEPTED))
        }
    }
}

fn empty(status: StatusCode) -> Response<FakeBody> {
    let mut resp = Response::new(Empty::new().boxed());
    *resp.status_mut() = status;
    resp
}

/// A broker of pod `pod-a` in front of the MCP server at `upstream`, with the flags' defaults
/// but for [`SESSION_CALLS`] and no resume budget.
fn broker(upstream: SocketAddr) -> Arc<Broker> {
    let cfg = BrokerConfig {
        versions: vec![VERSION],
        buffer: BufferLimits {
            max_events: 64,
            max_bytes: 1 << 20,
            ttl: Duration::from_secs(600),
            unread_ttl: Duration::from_secs(60),
        },
        idle_timeout: Duration::from_secs(600),
        reloaded_at: None,
        keep_alive: Duration::from_secs(15),
        max_upstream_body_bytes: 1 << 20,
        upstream_body_timeout: Duration::from_secs(30),
        upstream_retry: Duration::from_secs(1),
        rebuild_retry_for: Duration::from_secs(30),
        upstream_resume_attempts: 3,
        migration: Migration::Replay,
        replication: tether_crds::Replication::Sessions,
        write_ahead: true,
        resume_budget: None,
        max_initialize_bytes: 64 * 1024,
        max_journal_bytes: 1 << 20,
        max_session_retry_bytes: 8 << 20,
        retry_window: RetryWindow::DEFAULT,
        forward_headers: Vec::new(),
        forward_origin: false,
        binding: AuthBinding::SubjectAndClient,
        revalidate: Duration::ZERO,
        max_takeovers: None,
        max_event_bytes: 1 << 20,
        tasks: TaskLimits {
            max_open: 10_000,
            per_owner: 2500,
            poll_window: Duration::from_secs(60),
        },
        max_upstream_deletes: 8,
        write_ahead_max_tools: 64,
        calls: CallLimits {
            session: SESSION_CALLS,
            principal: 512,
            pod: 4096,
        },
    };
    let upstream = Upstream::new(
        format!("http://{upstream}/mcp").parse().unwrap(),
        &upstream.to_string(),
        Duration::from_secs(30),
        8,
    );
    let registry = Registry::new(1024, Retained::new(256 << 20));
    let minter = IdMinter::new(
        KeyRing::from_bytes(b"tether-broker-test-key".to_vec()),
        HomeToken::for_pod("pod-a"),
    );
    Broker::new(
        cfg,
        minter,
        upstream,
        registry,
        Arc::new(BrokerMetrics::new(&mut Default::default())),
    )
}

/// The write-ahead a broker asks for, recorded: `wait <id>` or `spared <id>` per request.
#[derive(Debug, Default)]
struct Waits(Mutex<Vec<String>>);

#[async_trait::async_trait]
impl super::WriteAhead for Waits {
    async fn written(&self, _: &Arc<Session>, requests: &[RequestKey]) {
        let ids = requests.iter().map(RequestKey::as_json);
        self.0.lock().extend(ids.map(|id| format!("wait {id}")));
    }

    fn spared(&self, requests: &[RequestKey]) {
        let ids = requests.iter().map(RequestKey::as_json);
        self.0.lock().extend(ids.map(|id| format!("spared {id}")));
    }
}

/// A broker in front of a [`FakeMcp`], and the admission its requests pass.
struct Pod {
    broker: Arc<Broker>,
    fake: FakeMcp,
    admission: AdmissionPolicy,
}

impl Pod {
    async fn start() -> Self {
        let fake = FakeMcp::start().await;
        Self {
            broker: broker(fake.addr),
            fake,
            admission: AdmissionPolicy {
                path: "/mcp".into(),
                origins: OriginPolicy::new(&[], true),
                versions: vec![VERSION],
                max_body_bytes: 1 << 20,
                envelope: EnvelopeLimits { max_batch: 64 },
            },
        }
    }

    /// A client's request as the proxy hands it to the broker once admitted: `session` and
    /// `cursor` in their headers, a POST with `body`.
    async fn request(
        &self,
        method: Method,
        session: Option<&str>,
        cursor: Option<&str>,
        body: Option<Value>,
    ) -> Reply {
        let mut headers = HeaderMap::new();
        let accept = match method {
            Method::POST => "application/json, text/event-stream",
            _ => "text/event-stream",
        };
        headers.insert(header::ACCEPT, HeaderValue::from_static(accept));
        if body.is_some() {
            let json = HeaderValue::from_static("application/json");
            headers.insert(header::CONTENT_TYPE, json);
        }
        if let Some(id) = session {
            headers.insert(MCP_SESSION_ID, id.parse().unwrap());
            headers.insert(MCP_PROTOCOL_VERSION, VERSION.as_str().parse().unwrap());
        }
        if let Some(cursor) = cursor {
            headers.insert(LAST_EVENT_ID, cursor.parse().unwrap());
        }
        let admitted = match self.admission.admit(&method, "/mcp", &headers) {
            Ok(Admission::Request(admitted)) => admitted,
            other => panic!("not admitted: {other:?}"),
        };
        let body = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
        self.broker.handle(admitted, Body::new(body), None).await
    }

    /// A session as a client opens it (`initialize`, then `notifications/initialized`): its id.
    async fn session(&self) -> String {
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": VERSION.as_str(),
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"},
        }});
        let reply = self.request(Method::POST, None, None, Some(init)).await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        let id = reply.headers[&MCP_SESSION_ID].to_str().unwrap().to_owned();
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let reply = self
            .request(Method::POST, Some(&id), None, Some(initialized))
            .await;
        assert_eq!(reply.status, StatusCode::ACCEPTED, "{reply:?}");
        id
    }

    /// `tools/call` of `tool` with JSON-RPC id `id` in `session`.
    async fn call(&self, session: &str, id: u64, tool: &str) -> Reply {
        let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                          "params": {"name": tool, "arguments": {}}});
        self.request(Method::POST, Some(session), None, Some(call))
            .await
    }
}

/// One event a client read: its id and its JSON-RPC message.
#[derive(Debug, PartialEq)]
struct Event {
    id: String,
    message: Value,
}

impl Event {
    fn seq(&self) -> u64 {
        EventId::parse(&self.id).unwrap().seq
    }

    /// The `progress` of a progress notification, `None` for anything else.
    fn progress(&self) -> Option<u64> {
        self.message["params"]["progress"].as_u64()
    }

    fn is_result(&self) -> bool {
        self.message.get("result").is_some()
    }
}

/// Reads an SSE reply until `enough` holds of the events read, or its stream ends; a reply
/// that is no SSE stream fails the test.
async fn read(reply: &mut Reply, enough: impl Fn(&[Event]) -> bool) -> Vec<Event> {
    let ReplyBody::Sse(feed) = &mut reply.body else {
        panic!("not an SSE stream: {reply:?}");
    };
    let mut bytes = Vec::new();
    loop {
        match feed.next().await {
            FeedItem::Data(chunk) => bytes.extend_from_slice(&chunk),
            FeedItem::End => return decode(&bytes).await,
            FeedItem::Lost => panic!("events lost"),
        }
        let read = decode(&bytes).await;
        if enough(&read) {
            return read;
        }
    }
}

/// Every event of an SSE reply, to its end.
async fn read_all(mut reply: Reply) -> Vec<Event> {
    read(&mut reply, |_| false).await
}

/// The complete events of SSE text (comments and incomplete events left out).
async fn decode(bytes: &[u8]) -> Vec<Event> {
    let body = Full::new(Bytes::copy_from_slice(bytes));
    events(body, usize::MAX)
        .map(|sse| {
            let sse = sse.unwrap();
            Event {
                id: sse.id.unwrap(),
                message: serde_json::from_str(&sse.data.unwrap()).unwrap(),
            }
        })
        .collect()
        .await
}

/// The `error.data.reason` of a rejection's JSON body.
fn reason(reply: &Reply) -> String {
    let ReplyBody::Full(body) = &reply.body else {
        panic!("no body: {reply:?}");
    };
    let body: Value = serde_json::from_slice(body).unwrap();
    body["error"]["data"]["reason"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn s01_s02_initialize_opens_one_upstream_session_and_answers_with_a_minted_id() {
    let pod = Pod::start().await;
    let id = pod.session().await;
    assert_eq!(id.len(), 60);
    assert!(id.bytes().all(|b| (0x21..=0x7e).contains(&b)), "{id}");
    assert!(
        !id.contains("upstream"),
        "the upstream's id never reaches the client"
    );
    assert_eq!(pod.fake.received("initialize"), 1);
    assert_eq!(pod.fake.received("notifications/initialized"), 1);
    let second = pod.session().await;
    assert_ne!(second, id);
    assert_eq!(
        pod.fake.received("initialize"),
        2,
        "one upstream session each"
    );
}

#[tokio::test]
async fn r03_l01_a_calls_events_are_numbered_and_a_resume_replays_exactly_those_after_the_cursor() {
    let pod = Pod::start().await;
    let session = pod.session().await;
    let mut reply = pod.call(&session, 7, "progress").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.headers[&MCP_SESSION_ID], session.as_str());
    let first = read(&mut reply, |read| read.len() == PROGRESS as usize).await;
    let seqs: Vec<u64> = first.iter().map(Event::seq).collect();
    assert_eq!(
        seqs,
        [1, 2, 3],
        "numbered from 1 on their stream: {first:?}"
    );
    let progress: Vec<Option<u64>> = first.iter().map(Event::progress).collect();
    assert_eq!(progress, [Some(1), Some(2), Some(3)]);
    // The client goes away after the first event it handled; the call goes on (L-01).
    drop(reply);
    pod.fake.release();
    let cursor = &first[0].id;
    let resumed = read_all(
        pod.request(Method::GET, Some(&session), Some(cursor), None)
            .await,
    )
    .await;
    assert_eq!(
        resumed[..2],
        first[1..],
        "replayed as first sent: {resumed:?}"
    );
    assert_eq!(resumed.len(), 3, "{resumed:?}");
    assert!(
        resumed[2].is_result() && resumed[2].seq() == 4,
        "{resumed:?}"
    );
    assert_eq!(
        EventId::parse(&resumed[2].id).unwrap().stream,
        EventId::parse(cursor).unwrap().stream,
        "its own stream"
    );
    let at_end = pod
        .request(Method::GET, Some(&session), Some(&resumed[2].id), None)
        .await;
    assert!(
        read_all(at_end).await.is_empty(),
        "nothing after the last event"
    );
    assert_eq!(pod.fake.received("tools/call 7"), 1);
}

#[tokio::test]
async fn l01_a_retry_after_its_client_went_away_joins_its_call_and_the_tool_runs_once() {
    let pod = Pod::start().await;
    let session = pod.session().await;
    let mut reply = pod.call(&session, 7, "progress").await;
    let first = read(&mut reply, |read| !read.is_empty()).await;
    drop(reply);
    let retry = pod.call(&session, 7, "progress").await;
    assert_eq!(retry.status, StatusCode::OK);
    pod.fake.release();
    let joined = read_all(retry).await;
    assert_eq!(
        joined[..first.len()],
        first,
        "the call's own stream from its start"
    );
    let seqs: Vec<u64> = joined.iter().map(Event::seq).collect();
    assert_eq!(seqs, [1, 2, 3, 4], "{joined:?}");
    assert!(joined[3].is_result());
    // Once answered, a retry gets the same answer again.
    let replayed = read_all(pod.call(&session, 7, "progress").await).await;
    assert_eq!(replayed, joined);
    assert_eq!(pod.fake.received("tools/call 7"), 1, "the tool ran once");
}

#[tokio::test]
async fn s09_the_same_id_with_another_body_while_its_call_runs_is_400_and_not_sent() {
    let pod = Pod::start().await;
    let session = pod.session().await;
    let mut running = pod.call(&session, 7, "progress").await;
    read(&mut running, |read| !read.is_empty()).await;
    let other = pod.call(&session, 7, "another").await;
    assert_eq!(other.status, StatusCode::BAD_REQUEST);
    assert_eq!(reason(&other), "request_id_reused");
    assert!(other.headers.get(MCP_SESSION_ID).is_none());
    pod.fake.release();
    let rest = read_all(running).await;
    assert!(rest.last().is_some_and(Event::is_result), "{rest:?}");
    assert_eq!(pod.fake.received("tools/call 7"), 1);
}

#[tokio::test]
async fn s05_s07_a_delete_ends_the_upstream_session_and_later_requests_get_404() {
    let pod = Pod::start().await;
    let session = pod.session().await;
    let deleted = pod
        .request(Method::DELETE, Some(&session), None, None)
        .await;
    assert_eq!(deleted.status, StatusCode::OK, "the upstream's answer");
    assert_eq!(pod.fake.received("DELETE upstream-1"), 1);
    let call = pod.call(&session, 1, "progress").await;
    assert_eq!(call.status, StatusCode::NOT_FOUND);
    assert_eq!(reason(&call), "session_not_found");
    let get = pod.request(Method::GET, Some(&session), None, None).await;
    assert_eq!(get.status, StatusCode::NOT_FOUND);
    let again = pod
        .request(Method::DELETE, Some(&session), None, None)
        .await;
    assert_eq!(again.status, StatusCode::NOT_FOUND);
    assert_eq!(pod.fake.received("tools/call 1"), 0);
    assert_eq!(pod.fake.received("DELETE upstream-1"), 1);
}

#[tokio::test]
async fn a_call_over_the_sessions_bound_of_calls_in_flight_is_429_and_never_sent() {
    let pod = Pod::start().await;
    let session = pod.session().await;
    let mut running = Vec::new();
    for id in 1..=SESSION_CALLS as u64 {
        let reply = pod.call(&session, id, "progress").await;
        assert_eq!(reply.status, StatusCode::OK);
        running.push(reply);
    }
    // The calls' clients went away: their calls still hold their slots.
    drop(running);
    let over = pod.call(&session, 3, "progress").await;
    assert_eq!(over.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reason(&over), "session_calls");
    assert!(over.headers.contains_key(header::RETRY_AFTER));
    assert_eq!(pod.fake.received("tools/call 3"), 0);
    // Another session has slots of its own.
    let other = pod.session().await;
    let reply = pod.call(&other, 3, "progress").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(pod.fake.received("tools/call 3"), 1);
}

#[tokio::test]
async fn only_a_request_whose_second_dispatch_could_harm_waits_for_the_write_ahead() {
    let pod = Pod::start().await;
    let waits = Arc::new(Waits::default());
    pod.broker
        .set_write_ahead(Arc::clone(&waits) as Arc<dyn super::WriteAhead>);
    pod.fake.release();
    let session = pod.session().await;
    let list = |id: u64, cursor: Option<&str>| {
        let params = cursor.map_or_else(|| json!({}), |c| json!({"cursor": c}));
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": params})
    };
    let call = async |id: u64, tool: &str| {
        let events = read_all(pod.call(&session, id, tool).await).await;
        assert!(events.last().is_some_and(Event::is_result), "{events:?}");
    };

    // Before the server listed its tools, a call of any waits.
    call(1, "search").await;
    // The first page (JSON) declares `search` read-only and `progress` nothing.
    let page = pod
        .request(Method::POST, Some(&session), None, Some(list(2, None)))
        .await;
    assert_eq!(page.status, StatusCode::OK);
    call(3, "search").await;
    call(4, "progress").await;
    // The second page (an SSE event) declares `lookup` read-only, `upsert` only idempotent.
    let page = pod
        .request(Method::POST, Some(&session), None, Some(list(5, Some("2"))))
        .await;
    assert_eq!(read_all(page).await.len(), 1);
    call(6, "lookup").await;
    call(7, "upsert").await;
    call(8, "never-listed").await;

    assert_eq!(
        *waits.0.lock(),
        [
            "wait 1", "spared 2", "spared 3", "wait 4", "spared 5", "spared 6", "wait 7", "wait 8"
        ]
    );
}
