//! The server's two faces: a `tower::Service` behind a [`kube::Client`] (`tower_test::mock`, kube-rs's
//! `ApiServerVerifier` pattern made generic) and plain HTTP/1.1 on a listener. Both answer with
//! [`answer`]: a LIST waits while the lists are held, a WATCH streams the event log.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::TokioIo;
use kube::Client;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::Shared;
use crate::server::{Call, decode_query};

/// The body of an answer: the whole object, or a watch that stays open.
type Answer = UnsyncBoxBody<Bytes, Infallible>;

/// Answers one request (its head and whole body) from `api`.
async fn answer(api: &Shared, parts: &http::request::Parts, bytes: &[u8]) -> Response<Answer> {
    let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
    let call = Call {
        method: parts.method.clone(),
        path: parts.uri.path(),
        query: decode_query(parts.uri.query().unwrap_or_default()),
        content_type: header("content-type").unwrap_or_default(),
        agent: header("user-agent"),
        body: serde_json::from_slice(bytes).unwrap_or(Value::Null),
    };
    let watching = call.is_collection_get() && call.is_watch();
    let mut held = {
        let mut server = api.lock().unwrap_or_else(PoisonError::into_inner);
        server
            .requests
            .push(format!("{} {}", parts.method, parts.uri));
        match (call.is_collection_get(), watching) {
            (true, true) => server.watches += 1,
            (true, false) => server.lists += 1,
            _ => {}
        }
        server.held.subscribe()
    };
    if call.is_collection_get() && !watching {
        let _ = held.wait_for(|held| !*held).await;
    }
    let (code, answer) = api
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .serve_one(&call);
    let body = if watching && code == 200 {
        let from = call.query.get("resourceVersion");
        let selector = call.query.get("labelSelector").cloned().unwrap_or_default();
        let from = from.and_then(|rv| rv.parse().ok()).unwrap_or(0);
        watch(api, call.path.to_owned(), from, selector)
    } else {
        Full::new(Bytes::from(serde_json::to_vec(&answer).unwrap_or_default())).boxed_unsync()
    };
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", "application/json")
        .body(body)
        .unwrap_or_default()
}

/// The body of a WATCH of `collection` from `resource_version`: the events of the objects
/// `selector` matches, one JSON line each, as they happen; it stays open.
fn watch(api: &Shared, collection: String, resource_version: u64, selector: String) -> Answer {
    let changed = api
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .changed
        .subscribe();
    let state = (Arc::clone(api), changed, resource_version, VecDeque::new());
    let events =
        futures::stream::unfold(state, move |(api, mut changed, mut after, mut pending)| {
            let (collection, selector) = (collection.clone(), selector.clone());
            async move {
                loop {
                    if let Some(line) = pending.pop_front() {
                        let frame = Ok::<_, Infallible>(Frame::data(Bytes::from(line)));
                        return Some((frame, (api, changed, after, pending)));
                    }
                    changed.borrow_and_update();
                    let found = api
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .events_after(&collection, after, &selector);
                    let (last, lines) = found.ok()?;
                    after = last;
                    pending.extend(lines);
                    if pending.is_empty() && changed.changed().await.is_err() {
                        return None;
                    }
                }
            }
        });
    StreamBody::new(events).boxed_unsync()
}

/// A request the server holds until the test releases it, to order the requests of two clients.
struct Gate {
    method: Method,
    path: String,
    arrived: oneshot::Sender<()>,
    release: oneshot::Receiver<()>,
}

/// The test's end of a [`client_holding`] gate.
pub struct Hold {
    arrived: oneshot::Receiver<()>,
    release: oneshot::Sender<()>,
}

impl Hold {
    /// Waits until the held request has arrived (the server answers nothing meanwhile).
    ///
    /// # Panics
    /// When the client's server stopped first.
    pub async fn arrived(&mut self) {
        (&mut self.arrived).await.expect("the held request arrives");
    }

    /// Lets the server answer the held request, against the state of then.
    pub fn release(self) {
        let _ = self.release.send(());
    }
}

/// Answers the requests of `handle` from `api` until the client is dropped.
async fn serve_mock(
    mut handle: tower_test::mock::Handle<Request<kube::client::Body>, Response<Answer>>,
    api: Shared,
    mut gate: Option<Gate>,
) {
    while let Some((request, respond)) = handle.next_request().await {
        let (parts, body) = request.into_parts();
        let bytes = body.collect_bytes().await.unwrap_or_default();
        let held = gate.take_if(|g| g.method == parts.method && g.path == parts.uri.path());
        if let Some(g) = held {
            let _ = g.arrived.send(());
            let _ = g.release.await;
        }
        respond.send_response(answer(&api, &parts, &bytes).await);
    }
}

/// A client of `api`; its server task runs until the client and its clones are dropped.
pub fn client_of(api: &Shared, namespace: &str) -> Client {
    let (service, handle) = tower_test::mock::pair();
    tokio::spawn(serve_mock(handle, Arc::clone(api), None));
    Client::new(service, namespace)
}

/// A client of `api` whose first `method` request to `path` waits for the test ([`Hold`]).
pub fn client_holding(api: &Shared, namespace: &str, method: Method, path: &str) -> (Client, Hold) {
    let (service, handle) = tower_test::mock::pair();
    let (arrived_tx, arrived) = oneshot::channel();
    let (release, release_rx) = oneshot::channel();
    let gate = Gate {
        method,
        path: path.to_owned(),
        arrived: arrived_tx,
        release: release_rx,
    };
    tokio::spawn(serve_mock(handle, Arc::clone(api), Some(gate)));
    (Client::new(service, namespace), Hold { arrived, release })
}

/// Serves `api` over plain HTTP/1.1 on `listener` until this future is dropped (which drops
/// every connection with it).
pub async fn serve_http(listener: TcpListener, api: Shared) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let Ok((io, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let api = Arc::clone(&api);
        connections.spawn(async move {
            let service =
                hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                    let api = Arc::clone(&api);
                    async move {
                        let (parts, body) = request.into_parts();
                        let bytes = body.collect().await.map(|b| b.to_bytes());
                        let bytes = bytes.unwrap_or_default();
                        Ok::<_, Infallible>(answer(&api, &parts, &bytes).await)
                    }
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(io), service)
                .await;
        });
        while connections.try_join_next().is_some() {}
    }
}
