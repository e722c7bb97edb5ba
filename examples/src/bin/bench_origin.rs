//! `tether-bench-origin`: a minimal MCP-shaped origin on hyper, fast enough to produce events
//! as fast as TCP allows (the rmcp example server is not), for benchmarks and tests. A pod runs
//! it behind the sidecar with `PodSpec { server: Upstream::Origin, .. }` (`tests/src/pod.rs`).
//!
//! It speaks just enough Streamable HTTP: one JSON-RPC message per POST (no batches), sessions
//! in a set of numbers (a few bytes each, so 200,000 sessions are cheap), no standalone stream,
//! no resumption (its SSE events carry no `id:`).
//!
//! | request | answer |
//! |---|---|
//! | POST `initialize` | 200 JSON (the requested `protocolVersion`, `capabilities: {tools: {}}`), a new `Mcp-Session-Id` |
//! | POST a notification or a response (no `id`, or no `method`) | 202, empty |
//! | POST `ping` | `{"result": {}}` |
//! | POST `tools/list` | the tools `echo`, `lookup` (annotated `readOnlyHint: true`) and `stream` |
//! | POST `tools/call` `echo` or `lookup` {`text`, `call_id`?} | JSON at once: `content: [{type: text, text}]` |
//! | POST `tools/call` `stream` {`count`, `interval_us` = 0, `size` = 0, `call_id`?} | SSE: `count` `notifications/progress` events, then the result `done <count>`, then the end |
//! | POST with an unknown `Mcp-Session-Id` | 404 (a request without one is served, statelessly) |
//! | DELETE with a known session | 200, the session forgotten; unknown 404 |
//! | GET on the MCP path | 405 (no standalone stream) |
//! | GET `/stats` | `{"executions", "calls", "duplicates", "completed", "aborted", "sessions"}` |
//! | GET `/healthz` | 200 |
//!
//! Each `stream` event is `{"progressToken": <the request's _meta.progressToken, else its
//! call_id, else its request id>, "progress": i, "total": count, "seq": i, "t": <the machine's
//! `CLOCK_MONOTONIC` in nanoseconds when the event was written>, "pad": "x" × size}`, `i` from 1 to
//! `count`. The events are made lazily as the connection takes them: with `interval_us` 0 as
//! many as fit in 64 KiB per body frame, so TCP backpressure holds the producer and nothing
//! piles up in memory; otherwise one per frame, `interval_us` apart.
//!
//! `/stats`, as the example server's: `executions` counts every tool call that ran, `calls` the
//! executions per `call_id` argument, `duplicates` the call ids executed more than once,
//! `completed` the calls whose answer was written to its end, `aborted` the `stream` calls whose
//! connection went away before their result, `sessions` the sessions held now.
//!
//! Bad input never panics: a body that is not one JSON-RPC message gets 400 with a short text;
//! an unknown method or tool and bad tool arguments get a JSON-RPC error (200) naming the
//! request's id.

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use parking_lot::Mutex;
use serde_json::{Value, json};

/// Command line.
#[derive(Debug, Parser)]
#[command(
    name = "tether-bench-origin",
    version,
    about = "A minimal, fast MCP-shaped origin for tether's benchmarks"
)]
struct Args {
    /// Address to listen on.
    #[arg(long)]
    listen: SocketAddr,
    /// Path of the MCP endpoint.
    #[arg(long, default_value = "/mcp")]
    path: String,
}

/// The body of every answer.
type Body = UnsyncBoxBody<Bytes, Infallible>;

/// Largest request body (413 beyond).
const MAX_REQUEST_BYTES: usize = 4 << 20;
/// Bytes of events gathered into one body frame of a `stream` without interval.
const FRAME_BYTES: usize = 64 << 10;
/// Largest `size` (padding per event) of a `stream` call.
const MAX_PAD_BYTES: u64 = 1 << 20;
/// The protocol version answered to an `initialize` that names none.
const DEFAULT_VERSION: &str = "2025-06-18";

/// The origin's state: its sessions and counters.
struct Origin {
    /// The MCP endpoint's path.
    path: String,
    /// This process's prefix of session ids, so a restarted origin knows none of its
    /// predecessor's sessions (and answers them 404, as a real server would).
    epoch: u32,
    /// The number of the next session.
    next_session: AtomicU64,
    /// The sessions held, by number.
    sessions: Mutex<HashSet<u64>>,
    /// Tool calls that ran.
    executions: AtomicU64,
    /// Tool calls whose answer was written to its end.
    completed: AtomicU64,
    /// `stream` calls dropped before their result.
    aborted: AtomicU64,
    /// Executions per `call_id` argument.
    calls: Mutex<HashMap<String, u64>>,
}

impl Origin {
    fn new(path: String) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        Self {
            path,
            epoch: nanos ^ std::process::id().rotate_left(16),
            next_session: AtomicU64::new(1),
            sessions: Mutex::default(),
            executions: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            aborted: AtomicU64::new(0),
            calls: Mutex::default(),
        }
    }

    /// Session number `n` as an `Mcp-Session-Id`: the epoch and the number, in hex.
    fn session_id(&self, n: u64) -> String {
        format!("{:08x}{n:016x}", self.epoch)
    }

    /// The number of session id `id`, when this process issued it (held or not).
    fn session_number(&self, id: &str) -> Option<u64> {
        let (epoch, n) = (id.get(..8)?, id.get(8..)?);
        if id.len() != 24 || u32::from_str_radix(epoch, 16).ok()? != self.epoch {
            return None;
        }
        u64::from_str_radix(n, 16).ok()
    }

    /// Whether session id `id` names a session held now.
    fn holds(&self, id: &str) -> bool {
        self.session_number(id)
            .is_some_and(|n| self.sessions.lock().contains(&n))
    }

    /// The `/stats` document.
    fn stats(&self) -> Value {
        let calls = self.calls.lock().clone();
        let duplicates: HashMap<&String, &u64> = calls.iter().filter(|(_, n)| **n > 1).collect();
        json!({
            "executions": self.executions.load(Ordering::Relaxed),
            "calls": calls,
            "duplicates": duplicates,
            "completed": self.completed.load(Ordering::Relaxed),
            "aborted": self.aborted.load(Ordering::Relaxed),
            "sessions": self.sessions.lock().len(),
        })
    }

    /// Answers one HTTP request.
    async fn route(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let path = req.uri().path();
        if req.method() == Method::GET && path == "/stats" {
            return json_answer(StatusCode::OK, &self.stats());
        }
        if req.method() == Method::GET && path == "/healthz" {
            return text(StatusCode::OK, "ok\n");
        }
        if path != self.path {
            return text(StatusCode::NOT_FOUND, "not found\n");
        }
        match *req.method() {
            Method::POST => self.post(req).await,
            Method::DELETE => self.delete(&req),
            _ => {
                let mut resp = text(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "no standalone stream: POST or DELETE\n",
                );
                resp.headers_mut()
                    .insert(header::ALLOW, HeaderValue::from_static("POST, DELETE"));
                resp
            }
        }
    }

    /// DELETE: forgets a held session (200), else 404.
    fn delete(&self, req: &Request<Incoming>) -> Response<Body> {
        let Some(id) = session_header(req) else {
            return text(StatusCode::BAD_REQUEST, "missing Mcp-Session-Id\n");
        };
        let removed = self
            .session_number(id)
            .is_some_and(|n| self.sessions.lock().remove(&n));
        if removed {
            text(StatusCode::OK, "")
        } else {
            session_not_found()
        }
    }

    /// POST: one JSON-RPC message.
    async fn post(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let session = session_header(&req).map(str::to_owned);
        let body = match Limited::new(req.into_body(), MAX_REQUEST_BYTES)
            .collect()
            .await
        {
            Ok(collected) => collected.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                return text(StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n");
            }
            Err(_) => return text(StatusCode::BAD_REQUEST, "request body broke off\n"),
        };
        let Ok(message @ Value::Object(_)) = serde_json::from_slice::<Value>(&body) else {
            return text(
                StatusCode::BAD_REQUEST,
                "the body is not one JSON-RPC message (a JSON object)\n",
            );
        };
        let method = message.get("method").and_then(Value::as_str);
        let id = message.get("id").cloned();
        if method == Some("initialize") {
            let Some(id) = id else {
                return text(StatusCode::BAD_REQUEST, "initialize without an id\n");
            };
            return self.initialize(id, &message);
        }
        if let Some(session) = &session
            && !self.holds(session)
        {
            return session_not_found();
        }
        // A notification (no id) or the client's answer to a request (no method).
        let (Some(id), Some(method)) = (id, method) else {
            return text(StatusCode::ACCEPTED, "");
        };
        let params = message.get("params");
        match method {
            "ping" => reply(id, json!({})),
            "tools/list" => reply(id, tools()),
            "tools/call" => self.call(id, params),
            _ => rpc_error(id, -32601, &format!("method not found: {method:.100}")),
        }
    }

    /// `initialize`: a new session.
    fn initialize(&self, id: Value, message: &Value) -> Response<Body> {
        let version = message
            .pointer("/params/protocolVersion")
            .and_then(Value::as_str)
            .unwrap_or(DEFAULT_VERSION);
        let n = self.next_session.fetch_add(1, Ordering::Relaxed);
        self.sessions.lock().insert(n);
        let mut resp = reply(
            id,
            json!({
                "protocolVersion": version,
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "tether-bench-origin", "version": "0"},
            }),
        );
        if let Ok(value) = HeaderValue::from_str(&self.session_id(n)) {
            resp.headers_mut().insert("mcp-session-id", value);
        }
        resp
    }

    /// `tools/call`: `echo`, `lookup` or `stream`.
    fn call(self: Arc<Self>, id: Value, params: Option<&Value>) -> Response<Body> {
        let name = params.and_then(|p| p.get("name")).and_then(Value::as_str);
        let empty = json!({});
        let args = params.and_then(|p| p.get("arguments")).unwrap_or(&empty);
        let call_id = args.get("call_id").and_then(Value::as_str);
        let count_execution = |origin: &Self| {
            origin.executions.fetch_add(1, Ordering::Relaxed);
            if let Some(call_id) = call_id {
                *origin.calls.lock().entry(call_id.to_owned()).or_default() += 1;
            }
        };
        match name {
            Some("echo" | "lookup") => {
                let Some(text) = args.get("text").and_then(Value::as_str) else {
                    return rpc_error(id, -32602, "echo and lookup need a string `text`");
                };
                count_execution(&self);
                self.completed.fetch_add(1, Ordering::Relaxed);
                reply(id, json!({"content": [{"type": "text", "text": text}]}))
            }
            Some("stream") => {
                let number = |name: &str, default: Option<u64>| match args.get(name) {
                    None | Some(Value::Null) => default,
                    Some(v) => v.as_u64(),
                };
                let (Some(count), Some(interval_us), Some(size)) = (
                    number("count", None),
                    number("interval_us", Some(0)),
                    number("size", Some(0)).filter(|&s| s <= MAX_PAD_BYTES),
                ) else {
                    return rpc_error(
                        id,
                        -32602,
                        "stream needs `count`, and optionally `interval_us` and `size` \
                         (at most 1 MiB), as non-negative integers",
                    );
                };
                let token = params
                    .and_then(|p| p.pointer("/_meta/progressToken"))
                    .cloned()
                    .or_else(|| call_id.map(|c| Value::String(c.to_owned())))
                    .unwrap_or_else(|| id.clone());
                count_execution(&self);
                let size = usize::try_from(size).unwrap_or(0);
                self.stream(Producer {
                    token: token.to_string(),
                    id: id.to_string(),
                    next: 1,
                    count,
                    interval: Duration::from_micros(interval_us),
                    pad: "x".repeat(size),
                    done: false,
                    origin: self.clone(),
                })
            }
            _ => rpc_error(id, -32602, "unknown tool: echo, lookup or stream"),
        }
    }

    /// The SSE answer of a `stream` call: `producer`'s frames, made as the connection takes them.
    fn stream(&self, producer: Producer) -> Response<Body> {
        let frames = futures::stream::unfold(producer, |mut p| async move {
            if p.done {
                return None;
            }
            let frame = if p.interval.is_zero() {
                p.batch()
            } else {
                if p.next > 1 {
                    tokio::time::sleep(p.interval).await;
                }
                p.one()
            };
            Some((Ok(Frame::data(Bytes::from(frame))), p))
        });
        let mut resp = Response::new(StreamBody::new(frames).boxed_unsync());
        let headers = resp.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        resp
    }
}

/// The events of one `stream` call still to write. Dropped before its result (the connection
/// went away), it counts the call as aborted.
struct Producer {
    /// The `progressToken`, as JSON text.
    token: String,
    /// The request's id, as JSON text.
    id: String,
    /// The `seq` of the next event (from 1).
    next: u64,
    count: u64,
    interval: Duration,
    /// `size` bytes of padding.
    pad: String,
    /// Whether the result was written.
    done: bool,
    origin: Arc<Origin>,
}

impl Producer {
    /// Events (and the result, once they are all out) up to [`FRAME_BYTES`] (at least one).
    fn batch(&mut self) -> String {
        let mut out = String::with_capacity(FRAME_BYTES + self.pad.len() + 256);
        while out.len() < FRAME_BYTES && !self.done {
            self.write_next(&mut out);
        }
        out
    }

    /// The next event, or the result.
    fn one(&mut self) -> String {
        let mut out = String::with_capacity(self.pad.len() + 256);
        self.write_next(&mut out);
        out
    }

    fn write_next(&mut self, out: &mut String) {
        if self.next <= self.count {
            let t = tether_tests::clock::monotonic_ns();
            let _ = write!(
                out,
                "data: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":\
                 {{\"progressToken\":{},\"progress\":{i},\"total\":{},\"seq\":{i},\"t\":{t},\
                 \"pad\":\"{}\"}}}}\n\n",
                self.token,
                self.count,
                self.pad,
                i = self.next,
            );
            self.next += 1;
        } else {
            let _ = write!(
                out,
                "data: {{\"jsonrpc\":\"2.0\",\"id\":{},\"result\":{{\"content\":\
                 [{{\"type\":\"text\",\"text\":\"done {}\"}}]}}}}\n\n",
                self.id, self.count
            );
            self.done = true;
            self.origin.completed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        if !self.done {
            self.origin.aborted.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The tools of `tools/list`.
fn tools() -> Value {
    json!({"tools": [
        {
            "name": "echo",
            "description": "Returns `text`",
            "inputSchema": {"type": "object", "properties": {
                "text": {"type": "string"}, "call_id": {"type": "string"}
            }, "required": ["text"]}
        },
        {
            "name": "lookup",
            "description": "Returns `text`; reads nothing, changes nothing",
            "inputSchema": {"type": "object", "properties": {
                "text": {"type": "string"}, "call_id": {"type": "string"}
            }, "required": ["text"]},
            "annotations": {"readOnlyHint": true}
        },
        {
            "name": "stream",
            "description": "Sends `count` progress notifications (`size` bytes of padding each, \
                            `interval_us` apart), then returns `done <count>`",
            "inputSchema": {"type": "object", "properties": {
                "count": {"type": "integer", "minimum": 0},
                "interval_us": {"type": "integer", "minimum": 0},
                "size": {"type": "integer", "minimum": 0},
                "call_id": {"type": "string"}
            }, "required": ["count"]}
        }
    ]})
}

/// The request's `Mcp-Session-Id`, when it has a readable one.
fn session_header(req: &Request<Incoming>) -> Option<&str> {
    req.headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
}

/// A plain-text answer.
fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from_static(body.as_bytes())).boxed_unsync());
    *resp.status_mut() = status;
    if !body.is_empty() {
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
    }
    resp
}

/// A JSON answer.
fn json_answer(status: StatusCode, value: &Value) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from(value.to_string())).boxed_unsync());
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// The JSON-RPC result `result` of request `id`.
fn reply(id: Value, result: Value) -> Response<Body> {
    json_answer(
        StatusCode::OK,
        &json!({"jsonrpc": "2.0", "id": id, "result": result}),
    )
}

/// The JSON-RPC error `code` of request `id`.
fn rpc_error(id: Value, code: i64, message: &str) -> Response<Body> {
    json_answer(
        StatusCode::OK,
        &json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}),
    )
}

/// The 404 of a session this origin does not hold.
fn session_not_found() -> Response<Body> {
    json_answer(
        StatusCode::NOT_FOUND,
        &json!({"jsonrpc": "2.0", "id": null,
                "error": {"code": -32001, "message": "session not found"}}),
    )
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    eprintln!(
        "tether-bench-origin listening on http://{}{}",
        args.listen, args.path
    );
    let origin = Arc::new(Origin::new(args.path));
    tether_tests::serve::http1(listener, "tether-bench-origin", move |req| {
        let origin = Arc::clone(&origin);
        async move { origin.route(req).await }
    })
    .await
}
