//! `tether-example-server`: an MCP server on the official Rust SDK (rmcp, Streamable HTTP,
//! stateful sessions, resumable streams). It is the upstream of tether's tests, of `make demo`
//! and of outside checks, so its tools follow a fixed contract:
//!
//! | tool | arguments | behaviour |
//! |---|---|---|
//! | `echo` | `text`, optional `repeat` | returns `text`, or `text` repeated `repeat` times (one large event: at most 64 MiB) |
//! | `slow` | `count`, `interval_ms`, `call_id`, optional `close_after` | `count` progress notifications (`progress` 1..count, `total` count) `interval_ms` apart on the request's stream, then `done <count>` one interval later; with `close_after = k` (negotiated ≥ 2025-11-25) the SSE connection is closed after the k-th progress with a `retry` hint and the call goes on (SEP-1699) |
//! | `counter` | – | increments and returns a per-session counter |
//! | `notify` | `text`, `count` | `count` `notifications/message` with `data: {"text", "seq"}` on the standalone GET stream, returns `sent <count>` |
//! | `confirm` | `call_id` | a multi round-trip request (2026-07-28): the first call gets an `InputRequiredResult` (an `elicitation/create` when the client declared elicitation, and a `requestState` sealed with this process's key, or `--request-state-key`'s); the retry with that state gets `confirmed <call_id>: <action>`, a state that does not verify -32602 ([`confirm`]; answered before the tool router, so not listed) |
//! | `job` | `ms`, `call_id` | runs `ms` then returns `done <call_id>`; called by a client that declares the tasks extension (`io.modelcontextprotocol/tasks`), it returns a task at once (`CreateTaskResult`, SEP-2663) polled with `tasks/get` and cancelled with `tasks/cancel` ([`job`]) |
//!
//! A 2026-07-28 `subscriptions/listen` that asks for `toolsListChanged` gets a
//! `notifications/tools/list_changed` every `--listen-interval-ms` until it ends.
//!
//! With `--auth-key FILE` it requires a bearer JWT (HS256) on every MCP request and binds its
//! sessions to the token's `sub` ([`auth`]); `/stats` then counts `unauthenticated` requests
//! (answered 401), among them `missing_credentials` (no bearer token at all), and
//! `principal_mismatches` (another `sub` on a session, answered 404).
//!
//! With `--rate-limit N` each caller may make N MCP requests per `--rate-window-ms`; beyond,
//! 429 + `Retry-After` ([`limit`]); `/stats` counts them (`rate_limited`).
//!
//! With `--local-only` it defends against DNS rebinding as SDK servers on loopback do (a `Host`
//! that is not local: 421; an `Origin` that is not local: 403, counted in `/stats`
//! `rejected_hosts` and `rejected_origins`), and `/stats` counts requests that came through a
//! proxy hop (`forwarded`, with `X-Forwarded-Host`).
//!
//! With `--unready-initializes N` the first N `initialize` requests after start get 503 +
//! `Retry-After` (a server still warming up, as a restarted one may be).
//!
//! With `--json-replies`, a POST whose stream carries exactly one JSON-RPC message (its
//! response) is answered with `application/json` once the call ends, as servers that prefer
//! JSON answers do; a stream with notifications stays SSE.
//!
//! Without a progress token, `slow` sends log notifications instead of progress; rmcp routes
//! those to the session's standalone GET stream (it routes only progress by token to a request's
//! stream).
//!
//! `GET /stats` → `{"executions": N, "calls": {"<call_id>": n}, "duplicates": {"<call_id>": n},
//! "completed": N, "aborted": N, "tasks": N, "listening": N, "request_states_verified": N,
//! "request_states_rejected": N}`: `slow` and `job` executions,
//! executions per call id (to merge over several servers: a call run once on each of two pods
//! ran twice), call ids executed more than once, calls that finished, calls whose task was
//! dropped before finishing (a stateless client disconnect, L-05), `job` calls that became
//! tasks, `subscriptions/listen` streams open now, and `confirm` retries whose state verified or
//! not.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use futures::{Stream, StreamExt};
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use parking_lot::Mutex;
use rmcp::handler::server::wrapper::Parameters;
// Logging (`notifications/message`) is deprecated by SEP-2577 but is part of this server's contract.
use rmcp::Peer;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, ClientJsonRpcMessage, ClientRequest,
    CreateTaskResult, GetTaskParams, GetTaskResult, Implementation, ProgressNotificationParam,
    ProtocolVersion, RequestId, ServerCapabilities, ServerConfig, ServerJsonRpcMessage,
    ServerNotification, SubscriptionFilter, UpdateTaskParams,
};
#[allow(deprecated)]
use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
use rmcp::service::RequestContext;
use rmcp::service::SubscriptionContext;
use rmcp::task_manager::TaskManager;
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError, SessionConfig,
};
use rmcp::transport::streamable_http_server::session::{
    ServerSseMessage, SessionId, SessionManager,
};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler, tool, tool_handler, tool_router};
use serde::Deserialize;
use serde_json::json;
use tokio_stream::wrappers::ReceiverStream;

mod auth;
mod confirm;
mod job;
mod limit;

/// Command line.
#[derive(Debug, Parser)]
#[command(
    name = "tether-example-server",
    version,
    about = "Example MCP server for tether"
)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
    /// Path of the MCP endpoint.
    #[arg(long, default_value = "/mcp")]
    path: String,
    /// Offer no standalone GET stream: a GET without Last-Event-ID gets 405 (spec T-09).
    #[arg(long)]
    no_standalone_stream: bool,
    /// `retry` hint, in ms, sent when `slow` closes its SSE connection (`close_after`).
    #[arg(long, default_value_t = 100)]
    close_retry_ms: u64,
    /// Idle time after which rmcp ends a session, in seconds.
    #[arg(long, default_value_t = 3600)]
    session_idle_secs: u64,
    /// Answer a POST whose stream carries only its response with `application/json`.
    #[arg(long)]
    json_replies: bool,
    /// Hold back each frame of a GET stream this long, in ms, as a busy network does: a
    /// standalone message reaches the client well after the answer of the call that sent it.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    standalone_delay_ms: u64,
    /// Answer the first N `initialize` requests after start 503 (a server still warming up).
    #[arg(long, value_name = "N", default_value_t = 0)]
    unready_initializes: u64,
    /// Defend against DNS rebinding as SDK servers on loopback do: a `Host` that is not
    /// `127.0.0.1`/`localhost` gets 421, an `Origin` that is not local gets 403.
    #[arg(long)]
    local_only: bool,
    /// The key of `confirm`'s request states (at least 32 bytes); without it each process
    /// draws its own, so a retry verifies only where its state was issued.
    #[arg(long, value_name = "FILE")]
    request_state_key: Option<std::path::PathBuf>,
    /// Require `Authorization: Bearer <JWT>` (HS256 with this file's bytes, `sub` and `exp`).
    #[arg(long, value_name = "FILE")]
    auth_key: Option<std::path::PathBuf>,
    /// Take this long, in ms, to check each request's credentials (`--auth-key`), as a server
    /// that introspects tokens at its authorization server does.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    auth_latency_ms: u64,
    /// Answer a caller's MCP requests beyond N per `--rate-window-ms` with 429 + `Retry-After`
    /// (0: no limit).
    #[arg(long, value_name = "N", default_value_t = 0)]
    rate_limit: u64,
    /// The window of `--rate-limit`, in ms.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    rate_window_ms: u64,
    /// Interval of `notifications/tools/list_changed` on a `subscriptions/listen` stream, in ms.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    listen_interval_ms: u64,
    /// Print `executed "<call_id>"` on stdout at each `slow` and `job` execution: what a client
    /// that cannot reach `/stats` counts (a pod's log, read through the API server, outlives
    /// the pod's network).
    #[arg(long)]
    log_calls: bool,
}

/// Execution counts per `slow` call id, for `GET /stats`.
#[derive(Debug, Default)]
struct Stats {
    /// `--log-calls`: each execution is also printed.
    log_calls: bool,
    per_call: Mutex<HashMap<String, u64>>,
    executions: AtomicU64,
    completed: AtomicU64,
    aborted: AtomicU64,
    unauthenticated: AtomicU64,
    /// Of `unauthenticated`: requests without a bearer token at all.
    missing_credentials: AtomicU64,
    principal_mismatches: AtomicU64,
    /// Requests answered 429 (`--rate-limit`).
    rate_limited: AtomicU64,
    /// MCP requests that carried `X-Forwarded-Host` (a proxy hop in front).
    forwarded: AtomicU64,
    /// Requests `--local-only` refused for their `Host` (421) / their `Origin` (403).
    rejected_hosts: AtomicU64,
    rejected_origins: AtomicU64,
    /// `job` calls that became tasks.
    tasks: AtomicU64,
    /// `subscriptions/listen` streams open now.
    listening: AtomicU64,
    /// `confirm` retries whose `requestState` verified / did not.
    request_states_verified: AtomicU64,
    request_states_rejected: AtomicU64,
}

impl Stats {
    /// Counts an execution of call `call_id` (`slow` or `job`), and prints it with `--log-calls`.
    fn executed(&self, call_id: &str) {
        self.executions.fetch_add(1, Ordering::Relaxed);
        *self.per_call.lock().entry(call_id.to_owned()).or_default() += 1;
        if self.log_calls {
            // Debug-quoted: a call id is the client's text.
            println!("executed {call_id:?}");
        }
    }

    fn json(&self) -> serde_json::Value {
        let calls = self.per_call.lock().clone();
        let duplicates: HashMap<_, _> = calls.iter().filter(|(_, n)| **n > 1).collect();
        json!({
            "executions": self.executions.load(Ordering::Relaxed),
            "calls": calls,
            "duplicates": duplicates,
            "completed": self.completed.load(Ordering::Relaxed),
            "aborted": self.aborted.load(Ordering::Relaxed),
            "unauthenticated": self.unauthenticated.load(Ordering::Relaxed),
            "missing_credentials": self.missing_credentials.load(Ordering::Relaxed),
            "rate_limited": self.rate_limited.load(Ordering::Relaxed),
            "principal_mismatches": self.principal_mismatches.load(Ordering::Relaxed),
            "forwarded": self.forwarded.load(Ordering::Relaxed),
            "rejected_hosts": self.rejected_hosts.load(Ordering::Relaxed),
            "rejected_origins": self.rejected_origins.load(Ordering::Relaxed),
            "tasks": self.tasks.load(Ordering::Relaxed),
            "listening": self.listening.load(Ordering::Relaxed),
            "request_states_verified": self.request_states_verified.load(Ordering::Relaxed),
            "request_states_rejected": self.request_states_rejected.load(Ordering::Relaxed),
        })
    }
}

/// Counts a `slow` call as completed or aborted (its task dropped before it finished), and
/// forgets its HTTP stream, when the call ends.
struct RunGuard<'a> {
    stats: &'a Stats,
    finished: bool,
    stream: Option<(&'a Sessions, SessionId, RequestId)>,
}

impl Drop for RunGuard<'_> {
    fn drop(&mut self) {
        if let Some((sessions, session, request)) = &self.stream {
            sessions.forget(session, request);
        }
        let counter = if self.finished {
            &self.stats.completed
        } else {
            &self.stats.aborted
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// rmcp's in-memory session manager, plus a record of which HTTP stream serves which request,
/// so `slow` can close its own SSE connection (`close_after`).
#[derive(Default)]
struct Sessions {
    inner: LocalSessionManager,
    streams: Mutex<HashMap<(SessionId, RequestId), u64>>,
}

impl SessionManager for Sessions {
    type Error = LocalSessionManagerError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        self.inner.create_session().await
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.inner.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.inner.has_session(id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.streams.lock().retain(|(sid, _), _| sid != id);
        self.inner.close_session(id).await
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let handle = self
            .inner
            .sessions
            .read()
            .await
            .get(id)
            .cloned()
            .ok_or_else(|| LocalSessionManagerError::SessionNotFound(id.clone()))?;
        let receiver = handle.establish_request_wise_channel().await?;
        // Remember the HTTP stream of `slow` calls that will close their connection; `slow`
        // forgets the entry when it ends, so the map holds only calls in flight.
        if let (ClientJsonRpcMessage::Request(req), Some(http_id)) =
            (&message, receiver.http_request_id)
            && let ClientRequest::CallToolRequest(call) = &req.request
            && call.params.name == "slow"
            && call
                .params
                .arguments
                .as_ref()
                .is_some_and(|a| a.contains_key("close_after"))
        {
            self.streams
                .lock()
                .insert((id.clone(), req.id.clone()), http_id);
        }
        handle
            .push_message(message, receiver.http_request_id)
            .await?;
        Ok(ReceiverStream::new(receiver.inner))
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.inner.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.create_standalone_stream(id).await
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.resume(id, last_event_id).await
    }
}

impl Sessions {
    /// Forgets the HTTP stream of a finished request.
    fn forget(&self, session: &SessionId, request: &RequestId) {
        self.streams
            .lock()
            .remove(&(session.clone(), request.clone()));
    }

    /// Closes the SSE connection of request `request` with a `retry` hint (SEP-1699).
    async fn close_connection(
        &self,
        session: &SessionId,
        request: &RequestId,
        retry: Duration,
    ) -> bool {
        let Some(http_id) = self
            .streams
            .lock()
            .get(&(session.clone(), request.clone()))
            .copied()
        else {
            return false;
        };
        let Some(handle) = self.inner.sessions.read().await.get(session).cloned() else {
            return false;
        };
        handle.close_sse_stream(http_id, Some(retry)).await.is_ok()
    }
}

#[derive(Debug, Deserialize, rmcp::schemars::JsonSchema)]
struct EchoArgs {
    text: String,
    repeat: Option<usize>,
}

/// Largest answer `echo` builds with `repeat`.
const MAX_ECHO_BYTES: usize = 64 << 20;

#[derive(Debug, Deserialize, rmcp::schemars::JsonSchema)]
struct SlowArgs {
    count: u32,
    interval_ms: u64,
    call_id: String,
    close_after: Option<u32>,
}

#[derive(Debug, Deserialize, rmcp::schemars::JsonSchema)]
struct NotifyArgs {
    text: String,
    count: u32,
}

/// One session's server (rmcp creates one per session).
struct ExampleServer {
    stats: Arc<Stats>,
    sessions: Arc<Sessions>,
    close_retry: Duration,
    counter: AtomicU64,
    /// The process's tasks (every session and stateless request shares them).
    tasks: TaskManager,
    listen_interval: Duration,
    /// Seals `confirm`'s request states.
    request_states: Arc<rmcp::model::RequestStateCodec>,
}

#[tool_router]
impl ExampleServer {
    #[tool(description = "Returns its text argument, repeated `repeat` times if given")]
    async fn echo(
        &self,
        Parameters(EchoArgs { text, repeat }): Parameters<EchoArgs>,
    ) -> Result<String, ErrorData> {
        let times = repeat.unwrap_or(1);
        if text.len().saturating_mul(times) > MAX_ECHO_BYTES {
            return Err(ErrorData::invalid_params(
                "the answer would exceed 64 MiB",
                None,
            ));
        }
        Ok(text.repeat(times))
    }

    #[tool(
        description = "Sends `count` progress notifications `interval_ms` apart, then returns `done <count>`"
    )]
    async fn slow(
        &self,
        Parameters(args): Parameters<SlowArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<String, ErrorData> {
        self.stats.executed(&args.call_id);
        let token = ctx.meta.get_progress_token();
        let interval = Duration::from_millis(args.interval_ms);
        let polling = ctx
            .peer
            .peer_info()
            .is_some_and(|info| info.protocol_version >= ProtocolVersion::V_2025_11_25);
        let session = ctx
            .extensions
            .get::<http::request::Parts>()
            .and_then(|p| p.headers.get("mcp-session-id"))
            .and_then(|v| v.to_str().ok())
            .map(|s| SessionId::from(s.to_owned()));
        let mut guard = RunGuard {
            stats: &self.stats,
            finished: false,
            stream: session
                .clone()
                .map(|s| (self.sessions.as_ref(), s, ctx.id.clone())),
        };
        for i in 1..=args.count {
            // `notifications/cancelled` stops the call (spec L-02); the guard counts it aborted.
            tokio::select! {
                () = pause(interval) => {}
                () = ctx.ct.cancelled() => return Err(ErrorData::internal_error("cancelled", None)),
            }
            let sent = match &token {
                Some(token) => {
                    ctx.peer
                        .notify_progress(
                            ProgressNotificationParam::new(token.clone(), f64::from(i))
                                .with_total(f64::from(args.count)),
                        )
                        .await
                }
                None => {
                    log_message(
                        &ctx.peer,
                        json!({"call_id": args.call_id, "progress": i, "total": args.count}),
                    )
                    .await
                }
            };
            if sent.is_err() {
                return Err(ErrorData::internal_error("the session went away", None));
            }
            if polling
                && args.close_after == Some(i)
                && let Some(session) = &session
            {
                self.sessions
                    .close_connection(session, &ctx.id, self.close_retry)
                    .await;
            }
        }
        tokio::time::sleep(interval).await;
        guard.finished = true;
        Ok(format!("done {}", args.count))
    }

    #[tool(
        description = "Runs `ms` then returns `done <call_id>`; a task for clients that declare the tasks extension"
    )]
    async fn job(&self, Parameters(args): Parameters<job::JobArgs>) -> String {
        job::run(&self.stats, &args).await
    }

    #[tool(description = "Increments and returns a per-session counter")]
    async fn counter(&self) -> String {
        (self.counter.fetch_add(1, Ordering::Relaxed) + 1).to_string()
    }

    #[tool(description = "Sends `count` log notifications on the standalone GET stream")]
    async fn notify(
        &self,
        Parameters(NotifyArgs { text, count }): Parameters<NotifyArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<String, ErrorData> {
        for seq in 1..=count {
            if log_message(&ctx.peer, json!({"text": text, "seq": seq}))
                .await
                .is_err()
            {
                return Err(ErrorData::internal_error("the session went away", None));
            }
        }
        Ok(format!("sent {count}"))
    }
}

/// Runs `f` when dropped (a listen stream counted while it is open, however it ends).
fn scopeguard(f: impl FnOnce()) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

/// Waits `interval`; a zero interval only yields (a timer rounds it up to a millisecond, which
/// would make a call of 100,000 events take 100 s).
async fn pause(interval: Duration) {
    if interval.is_zero() {
        tokio::task::yield_now().await;
    } else {
        tokio::time::sleep(interval).await;
    }
}

/// Sends a `notifications/message` at level info.
#[allow(deprecated)]
async fn log_message(
    peer: &Peer<RoleServer>,
    data: serde_json::Value,
) -> Result<(), rmcp::service::ServiceError> {
    peer.notify_logging_message(LoggingMessageNotificationParam::new(
        LoggingLevel::Info,
        data,
    ))
    .await
}

#[tool_handler(name = "tether-example-server")]
impl ServerHandler for ExampleServer {
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let tasks_declared = context
            .client_capabilities()
            .is_some_and(|caps| caps.supports_tasks());
        if request.name == "confirm" {
            let elicitation = context
                .client_capabilities()
                .is_some_and(|caps| caps.elicitation.is_some());
            return confirm::call(&self.request_states, &self.stats, &request, elicitation);
        }
        if request.name == "job" && tasks_declared {
            let args = job::JobArgs::parse(request.arguments.as_ref())?;
            let task = job::spawn(&self.tasks, Arc::clone(&self.stats), args);
            return Ok(CallToolResponse::Task(CreateTaskResult::new(task)));
        }
        let call = rmcp::handler::server::tool::ToolCallContext::new(self, request, context);
        Self::tool_router().call(call).await
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        Ok(GetTaskResult::new(self.tasks.get_task(&request.task_id)?))
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.tasks
            .update_task(&request.task_id, request.input_responses)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.tasks.cancel_task(&request.task_id)
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .enable_tasks()
                .build(),
        )
        .with_server_info(Implementation::new(
            "tether-example-server",
            env!("CARGO_PKG_VERSION"),
        ))
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        let mut accepted = SubscriptionFilter::new();
        accepted.tools_list_changed = requested.tools_list_changed;
        Some(accepted)
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        self.stats.listening.fetch_add(1, Ordering::Relaxed);
        let _open = scopeguard(|| {
            self.stats.listening.fetch_sub(1, Ordering::Relaxed);
        });
        if context.accepted().tools_list_changed != Some(true) || self.listen_interval.is_zero() {
            context.cancelled().await;
            return Ok(());
        }
        loop {
            tokio::select! {
                () = context.cancelled() => return Ok(()),
                () = tokio::time::sleep(self.listen_interval) => {}
            }
            let changed = ServerNotification::ToolListChangedNotification(Default::default());
            if context.sink().send(changed).await.is_err() {
                return Ok(());
            }
        }
    }
}

type HttpBody = BoxBody<Bytes, Infallible>;

fn full(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<HttpBody> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .body(Full::new(body.into()).boxed())
        .unwrap_or_default()
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    let stats = Arc::new(Stats {
        log_calls: args.log_calls,
        ..Stats::default()
    });
    let mut inner = LocalSessionManager::default();
    inner.session_config = {
        let mut c = SessionConfig::default();
        // Large enough that a resume after `close_after` never finds the cache overrun.
        c.channel_capacity = 4096;
        c.keep_alive = Some(Duration::from_secs(args.session_idle_secs));
        c
    };
    let sessions = Arc::new(Sessions {
        inner,
        streams: Mutex::default(),
    });
    let factory = {
        let (stats, sessions) = (Arc::clone(&stats), Arc::clone(&sessions));
        let close_retry = Duration::from_millis(args.close_retry_ms);
        let listen_interval = Duration::from_millis(args.listen_interval_ms);
        let tasks = TaskManager::new();
        let key = args
            .request_state_key
            .as_deref()
            .map(std::fs::read)
            .transpose()?;
        let request_states = Arc::new(confirm::codec(key)?);
        move || {
            Ok(ExampleServer {
                stats: Arc::clone(&stats),
                sessions: Arc::clone(&sessions),
                close_retry,
                counter: AtomicU64::new(0),
                tasks: tasks.clone(),
                listen_interval,
                request_states: Arc::clone(&request_states),
            })
        }
    };
    let config = StreamableHttpServerConfig::default().disable_allowed_hosts();
    let mcp = StreamableHttpService::new(factory, Arc::clone(&sessions), config);
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    eprintln!(
        "tether-example-server listening on http://{}{}",
        args.listen, args.path
    );
    let app = Arc::new(App {
        auth: args.auth_key.as_deref().map(auth::Auth::load).transpose()?,
        unready: AtomicU64::new(args.unready_initializes),
        rate_limit: (args.rate_limit > 0).then(|| {
            limit::RateLimit::new(args.rate_limit, Duration::from_millis(args.rate_window_ms))
        }),
        mcp,
        stats,
        args,
    });
    tether_tests::serve::http1(listener, "tether-example-server", move |req| {
        let app = Arc::clone(&app);
        async move { app.route(req).await }
    })
    .await
}

/// What the HTTP handler serves: the MCP service, its counters, its flags and `--auth-key`.
struct App {
    mcp: StreamableHttpService<ExampleServer, Sessions>,
    stats: Arc<Stats>,
    args: Args,
    auth: Option<auth::Auth>,
    /// `initialize` requests still to refuse (`--unready-initializes`).
    unready: AtomicU64,
    /// `--rate-limit`, when set.
    rate_limit: Option<limit::RateLimit>,
}

impl App {
    async fn route(&self, req: Request<Incoming>) -> Response<HttpBody> {
        let path = req.uri().path();
        if path == "/stats" && req.method() == Method::GET {
            return full(
                StatusCode::OK,
                "application/json",
                self.stats.json().to_string(),
            );
        }
        if path != self.args.path {
            return full(StatusCode::NOT_FOUND, "text/plain", "not found\n");
        }
        if req.headers().contains_key("x-forwarded-host") {
            self.stats.forwarded.fetch_add(1, Ordering::Relaxed);
        }
        if self.args.local_only
            && let Some(refusal) = not_local(req.headers())
        {
            let counter = if refusal.status() == StatusCode::MISDIRECTED_REQUEST {
                &self.stats.rejected_hosts
            } else {
                &self.stats.rejected_origins
            };
            counter.fetch_add(1, Ordering::Relaxed);
            return refusal;
        }
        let initialize =
            req.method() == Method::POST && !req.headers().contains_key("mcp-session-id");
        if initialize
            && self
                .unready
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
        {
            let mut resp = full(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                "warming up\n",
            );
            resp.headers_mut()
                .insert(header::RETRY_AFTER, http::HeaderValue::from_static("1"));
            return resp;
        }
        let Some(auth) = &self.auth else {
            if let Some(refusal) = self.rate_limited("") {
                return refusal;
            }
            return self.serve(req).await;
        };
        if self.args.auth_latency_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.args.auth_latency_ms)).await;
        }
        let sub = match auth.caller(req.headers()) {
            Ok(sub) => sub,
            Err(why) => {
                self.stats.unauthenticated.fetch_add(1, Ordering::Relaxed);
                if why == auth::Unauthenticated::Missing {
                    self.stats
                        .missing_credentials
                        .fetch_add(1, Ordering::Relaxed);
                }
                let mut resp = full(StatusCode::UNAUTHORIZED, "text/plain", "unauthorized\n");
                resp.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    http::HeaderValue::from_static(why.challenge()),
                );
                return resp;
            }
        };
        if let Some(refusal) = self.rate_limited(&sub) {
            return refusal;
        }
        let session = req
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let Some(session) = session else {
            // An `initialize` (or a stateless request): its session, if any, is this `sub`'s.
            let resp = self.serve(req).await;
            if let Some(id) = resp
                .headers()
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok())
            {
                auth.bind(id, &sub);
            }
            return resp;
        };
        if !auth.may_use(&session, &sub) {
            self.stats
                .principal_mismatches
                .fetch_add(1, Ordering::Relaxed);
            return full(StatusCode::NOT_FOUND, "text/plain", "session not found\n");
        }
        let delete = req.method() == Method::DELETE;
        let resp = self.serve(req).await;
        if delete && resp.status().is_success() {
            auth.forget(&session);
        }
        resp
    }

    /// The 429 for a request of `caller` beyond `--rate-limit`, counted; `None` within it.
    fn rate_limited(&self, caller: &str) -> Option<Response<HttpBody>> {
        let retry_after = self
            .rate_limit
            .as_ref()?
            .check(caller, std::time::Instant::now())?;
        self.stats.rate_limited.fetch_add(1, Ordering::Relaxed);
        let mut resp = full(
            StatusCode::TOO_MANY_REQUESTS,
            "text/plain",
            "rate limit exceeded\n",
        );
        resp.headers_mut()
            .insert(header::RETRY_AFTER, http::HeaderValue::from(retry_after));
        Some(resp)
    }

    /// The MCP service's answer (`--no-standalone-stream`, `--json-replies` applied).
    async fn serve(&self, req: Request<Incoming>) -> Response<HttpBody> {
        if self.args.no_standalone_stream
            && req.method() == Method::GET
            && !req.headers().contains_key("last-event-id")
        {
            let mut resp = full(
                StatusCode::METHOD_NOT_ALLOWED,
                "text/plain",
                "no standalone stream\n",
            );
            resp.headers_mut().insert(
                header::ALLOW,
                http::HeaderValue::from_static("POST, DELETE"),
            );
            return resp;
        }
        let method = req.method().clone();
        let resp = self.mcp.handle(req).await;
        if self.args.json_replies && method == Method::POST {
            return as_json(resp).await;
        }
        if self.args.standalone_delay_ms > 0 && method == Method::GET {
            return delayed(resp, Duration::from_millis(self.args.standalone_delay_ms));
        }
        resp
    }
}

/// `--local-only`: the answer to a request whose `Host` (421) or `Origin` (403) is not local,
/// as the Python SDK and go-sdk answer it on loopback.
fn not_local(headers: &http::HeaderMap) -> Option<Response<HttpBody>> {
    let local = |host: &str| {
        let name = host.rsplit_once(':').map_or(host, |(name, _)| name);
        name == "localhost" || name.starts_with("127.") || name == "[::1]"
    };
    let value = |name| headers.get(name).and_then(|v| v.to_str().ok());
    if !value(header::HOST).is_some_and(local) {
        return Some(full(
            StatusCode::MISDIRECTED_REQUEST,
            "text/plain",
            "invalid Host header\n",
        ));
    }
    let origin_local = |origin: &str| {
        origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            .is_some_and(local)
    };
    if value(header::ORIGIN).is_some_and(|o| !origin_local(o)) {
        return Some(full(
            StatusCode::FORBIDDEN,
            "text/plain",
            "invalid Origin header\n",
        ));
    }
    None
}

/// `--standalone-delay-ms`: `resp` with each frame of its body held back `delay`, in order.
fn delayed(resp: Response<HttpBody>, delay: Duration) -> Response<HttpBody> {
    let (parts, body) = resp.into_parts();
    let frames = http_body_util::BodyStream::new(body).then(move |frame| async move {
        tokio::time::sleep(delay).await;
        frame
    });
    Response::from_parts(parts, BoxBody::new(http_body_util::StreamBody::new(frames)))
}

/// `--json-replies`: an SSE answer that carries one JSON-RPC message, as `application/json`
/// (read to its end first); any other answer as it was.
async fn as_json(resp: Response<HttpBody>) -> Response<HttpBody> {
    let sse = resp.status() == StatusCode::OK
        && resp
            .headers()
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if !sse {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let Ok(collected) = body.collect().await;
    let bytes = collected.to_bytes();
    let mut messages = sse_messages(&bytes);
    if messages.len() != 1 {
        return Response::from_parts(parts, Full::new(bytes).boxed());
    }
    parts.headers.insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Full::new(Bytes::from(messages.remove(0))).boxed())
}

/// The non-empty `data` of each event of an SSE body (priming events carry none).
fn sse_messages(body: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(body);
    let (mut messages, mut data) = (Vec::new(), Vec::new());
    for line in text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l)) {
        if line.is_empty() {
            if !data.is_empty() {
                messages.push(data.join("\n"));
                data.clear();
            }
        } else if let Some(value) = line.strip_prefix("data:") {
            data.push(value.strip_prefix(' ').unwrap_or(value).to_owned());
        }
    }
    messages.retain(|m| !m.is_empty());
    messages
}
