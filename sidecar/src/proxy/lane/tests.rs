//! Component tests of the request's lane, in process: a real broker, router, admission and
//! [`Handoff`] over a membership view of three routable pods (`pod-a` is this one), a request
//! head and a body the test holds, on paused tokio time. Each test decides one request's lane
//! and checks where it goes, what it was answered with, and whether its body was read — a
//! forwarded body must reach the peer untouched.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use serde_json::{Value, json};

use super::{BodySource, Head, Lane, Lanes};
use crate::cluster::membership::fixtures::peer;
use crate::cluster::membership::{PeerState, Snapshot, Source};
use crate::cluster::routing::ForwardKind;
use crate::handoff::fixtures;
use crate::mcp::headers::{MCP_METHOD, MCP_NAME, MCP_PROTOCOL_VERSION, MCP_SESSION_ID};
use crate::mcp::origin::OriginCheck;
use crate::mcp::rejection::{NotFound, Rejection};
use crate::peer::client::{Destination, PeerLink, SendError};
use crate::peer::{PROBE_PATH, SESSIONS_PATH};
use crate::proxy::connection::Port;
use crate::proxy::metrics::ProxyMetrics;
use crate::proxy::slots::Full;

/// Peers that are never reached: no test here moves a session.
#[derive(Debug)]
struct NoPeers;

#[async_trait::async_trait]
impl PeerLink for NoPeers {
    async fn ask(&self, _: Destination<'_>, _: &str, _: Bytes) -> Result<Bytes, SendError> {
        Err(SendError::Unreachable("no peers in this test".into()))
    }
}

/// A body the test sends: its chunks, then its end (or a break), and what the lane did with it.
#[derive(Debug, Default)]
struct Sent {
    chunks: VecDeque<Bytes>,
    breaks: bool,
    /// Chunks the lane read.
    read: usize,
    kept_for_resend: bool,
}

impl Sent {
    fn json(value: &Value) -> Self {
        Self {
            chunks: VecDeque::from([Bytes::from(value.to_string())]),
            ..Self::default()
        }
    }
}

#[async_trait::async_trait]
impl BodySource for Sent {
    async fn chunk(&mut self) -> Result<Option<Bytes>, ()> {
        match self.chunks.pop_front() {
            Some(chunk) => {
                self.read += 1;
                Ok(Some(chunk))
            }
            None if self.breaks => Err(()),
            None => Ok(None),
        }
    }

    fn keep_for_resend(&mut self) {
        self.kept_for_resend = true;
    }

    fn too_large_to_resend(&self) -> bool {
        false
    }
}

/// Pod `pod-a` of three routable pods ([`fixtures::Pod`]), its endpoint allowing one browser
/// origin, its requests' bodies at most 4 KiB.
struct Pod {
    pod: fixtures::Pod,
    /// The lane's counts, registered with the pod's.
    metrics: ProxyMetrics,
}

impl std::ops::Deref for Pod {
    type Target = fixtures::Pod;

    fn deref(&self) -> &fixtures::Pod {
        &self.pod
    }
}

impl Pod {
    fn start() -> Self {
        let endpoint = format!(
            "{}  origins: {{allow: [\"https://app.example.com\"]}}\n",
            fixtures::ENDPOINT
        );
        let mut pod =
            fixtures::Pod::start(&endpoint, &["--max-request-bytes=4096"], Arc::new(NoPeers));
        let metrics = ProxyMetrics::new(&mut pod.registry);
        Self { pod, metrics }
    }

    fn lanes(&self) -> Lanes<'_> {
        Lanes {
            broker: &self.broker,
            router: &self.router,
            policy: Arc::new(self.cfg.admission.clone()),
            lifecycle: &self.lifecycle,
            handoff: &self.handoff,
            metrics: &self.metrics,
            body_timeout: Duration::from_secs(10),
        }
    }

    async fn decide(&self, head: &Head, body: &mut Sent) -> (Lane, OriginCheck) {
        self.lanes().decide(head, body).await
    }

    /// `tether_requests_total` and `tether_mrtr_retries_total` as exposed.
    fn counted(&self, family: &str) -> Vec<String> {
        self.encode()
            .lines()
            .filter(|l| l.starts_with(family))
            .map(str::to_owned)
            .collect()
    }
}

/// A client's request on the MCP port: a sessionful one (`2025-06-18`) unless `version` says
/// otherwise.
fn head(method: Method, session: Option<&str>) -> Head {
    let mut headers = HeaderMap::new();
    let accept = match method {
        Method::POST => "application/json, text/event-stream",
        _ => "text/event-stream",
    };
    headers.insert(header::ACCEPT, HeaderValue::from_static(accept));
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(MCP_PROTOCOL_VERSION, HeaderValue::from_static("2025-06-18"));
    if let Some(id) = session {
        headers.insert(MCP_SESSION_ID, id.parse().unwrap());
    }
    Head {
        method,
        path: "/mcp".into(),
        headers,
        port: Port::Mcp,
        refused: None,
    }
}

/// A 2026-07-28 POST of `method`, its `Mcp-Method` header saying `header_method`.
fn stateless(header_method: &str) -> Head {
    let mut head = head(Method::POST, None);
    head.headers
        .insert(MCP_PROTOCOL_VERSION, HeaderValue::from_static("2026-07-28"));
    head.headers
        .insert(MCP_METHOD, header_method.parse().unwrap());
    head.headers
        .insert(MCP_NAME, HeaderValue::from_static("echo"));
    head
}

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}})
}

fn call(id: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": "echo", "arguments": {}}})
}

/// The refusal's rejection and whether the connection closes, or the lane it was not.
fn refused(lane: Lane) -> (Rejection, bool) {
    match lane {
        Lane::Refuse(refusal) => (refusal.rejection, refusal.close),
        other => panic!("not refused: {other:?}"),
    }
}

/// The forward's peer and kind, or the lane it was not.
fn forwarded(lane: Lane) -> (String, ForwardKind, bool) {
    match lane {
        Lane::Forward(f) => (f.peer.uid, f.kind, f.at_most_once),
        other => panic!("not forwarded: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn peer_messages_take_the_peer_lane_on_the_peer_port_only() {
    let pod = Pod::start();
    let mut message = head(Method::POST, None);
    message.path = SESSIONS_PATH.into();
    message.port = Port::Peer { tls: true };
    let (lane, _) = pod.decide(&message, &mut Sent::default()).await;
    assert!(matches!(lane, Lane::Peer), "{lane:?}");
    // On the MCP port the same path is a path the endpoint does not serve.
    message.port = Port::Mcp;
    let (lane, _) = pod.decide(&message, &mut Sent::default()).await;
    assert_eq!(refused(lane).0.status(), StatusCode::NOT_FOUND);
    let mut probe = head(Method::GET, None);
    probe.path = PROBE_PATH.into();
    let (lane, _) = pod.decide(&probe, &mut Sent::default()).await;
    assert!(matches!(lane, Lane::Probe), "{lane:?}");
}

#[tokio::test(start_paused = true)]
async fn o02_a_foreign_origin_is_refused_and_a_listed_one_is_echoed() {
    let pod = Pod::start();
    let mut request = head(Method::POST, None);
    request.headers.insert(
        header::ORIGIN,
        HeaderValue::from_static("https://evil.example"),
    );
    let mut body = Sent::json(&initialize());
    let (lane, origin) = pod.decide(&request, &mut body).await;
    assert_eq!(refused(lane).0, Rejection::OriginForbidden);
    assert!(matches!(origin, OriginCheck::Forbidden), "{origin:?}");
    assert_eq!(body.read, 0, "a refused request's body is not read");
    request.headers.insert(
        header::ORIGIN,
        HeaderValue::from_static("https://app.example.com"),
    );
    let (lane, origin) = pod.decide(&request, &mut body).await;
    assert!(matches!(lane, Lane::Session { .. }), "{lane:?}");
    assert!(matches!(origin, OriginCheck::Allowed(_)), "{origin:?}");
}

#[tokio::test(start_paused = true)]
async fn an_unsupported_version_is_answered_with_the_requests_id() {
    let pod = Pod::start();
    let mut request = head(Method::POST, None);
    request
        .headers
        .insert(MCP_PROTOCOL_VERSION, HeaderValue::from_static("2099-01-01"));
    let (lane, _) = pod.decide(&request, &mut Sent::json(&call(41))).await;
    match lane {
        Lane::Refuse(refusal) => {
            assert!(matches!(
                refusal.rejection,
                Rejection::UnsupportedVersion(_)
            ));
            assert_eq!(refusal.id.unwrap().as_json(), "41");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_connection_over_its_slots_gets_503_and_its_body_is_left_alone() {
    let pod = Pod::start();
    for (full, rejection) in [
        (Full::Source, Rejection::SourceConnections),
        (Full::Listener, Rejection::TooManyConnections),
    ] {
        let mut request = head(Method::POST, None);
        request.refused = Some(full);
        let mut body = Sent::json(&initialize());
        let (lane, _) = pod.decide(&request, &mut body).await;
        assert_eq!(refused(lane), (rejection, false));
        assert_eq!(body.read, 0);
    }
}

#[tokio::test(start_paused = true)]
async fn an_initialize_is_served_here_with_its_body_parsed_once() {
    let pod = Pod::start();
    let mut body = Sent::json(&initialize());
    let (lane, _) = pod.decide(&head(Method::POST, None), &mut body).await;
    match lane {
        Lane::Session {
            body: parsed,
            entered,
            ..
        } => {
            assert!(parsed.is_initialize(), "the lane parsed the envelope");
            assert!(entered.is_none());
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        pod.counted("tether_requests_total"),
        [r#"tether_requests_total{method="POST",era="sessionful"} 1"#]
    );
}

#[tokio::test(start_paused = true)]
async fn a_draining_pod_places_an_initialize_on_a_peer_without_reading_it() {
    let pod = Pod::start();
    assert!(pod.lifecycle.start_draining());
    let mut body = Sent::json(&initialize());
    let (lane, _) = pod.decide(&head(Method::POST, None), &mut body).await;
    let (to, kind, at_most_once) = forwarded(lane);
    assert!(to == "pod-b" || to == "pod-c", "{to}");
    assert_eq!((kind, at_most_once), (ForwardKind::Placement, false));
    assert_eq!(body.read, 0, "pingora relays a forwarded body");
    assert!(pod.counted("tether_requests_total").is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_session_held_here_is_entered_and_served_here() {
    let pod = Pod::start();
    let session = pod.hold("pod-a");
    let (lane, _) = pod
        .decide(
            &head(Method::POST, Some(session.id())),
            &mut Sent::json(&call(1)),
        )
        .await;
    match lane {
        Lane::Session { entered, body, .. } => {
            let guard = entered.expect("entered");
            assert!(Arc::ptr_eq(guard.session(), &session));
            assert_eq!(
                session.entering(),
                1,
                "the guard holds the session in place"
            );
            assert!(!body.is_initialize());
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(session.entering(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_session_homed_on_a_live_peer_goes_home_untouched() {
    let pod = Pod::start();
    let id = pod.mint("pod-b").0;
    let mut body = Sent::json(&call(1));
    let (lane, _) = pod.decide(&head(Method::POST, Some(&id)), &mut body).await;
    assert_eq!(forwarded(lane), ("pod-b".into(), ForwardKind::Home, false));
    assert_eq!(body.read, 0);
}

#[tokio::test(start_paused = true)]
async fn a_session_handed_off_from_here_follows_it_to_its_new_holder() {
    let pod = Pod::start();
    let session = pod.hold("pod-a");
    pod.broker.mark_moved(&session, "pod-c");
    let (lane, _) = pod
        .decide(&head(Method::GET, Some(session.id())), &mut Sent::default())
        .await;
    assert_eq!(forwarded(lane), ("pod-c".into(), ForwardKind::Moved, false));
}

#[tokio::test(start_paused = true)]
async fn a_request_waits_out_a_move_then_is_served_where_the_session_is() {
    let pod = Pod::start();
    let session = pod.hold("pod-a");
    // The move fails after a second: the session stays here and the request enters it.
    let transfer = session.begin_move().expect("held");
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(transfer);
    });
    let started = tokio::time::Instant::now();
    let (lane, _) = pod
        .decide(&head(Method::GET, Some(session.id())), &mut Sent::default())
        .await;
    assert!(
        matches!(
            lane,
            Lane::Session {
                entered: Some(_),
                ..
            }
        ),
        "{lane:?}"
    );
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    // A move that never ends: 503 after MOVE_WAIT, so the client retries.
    let _transfer = session.begin_move().expect("held");
    let started = tokio::time::Instant::now();
    let (lane, _) = pod
        .decide(&head(Method::GET, Some(session.id())), &mut Sent::default())
        .await;
    assert_eq!(refused(lane).0, Rejection::PeerUnavailable);
    assert_eq!(started.elapsed(), super::MOVE_WAIT);
}

#[tokio::test(start_paused = true)]
async fn fr15_a_post_for_a_session_nobody_holds_is_404_unless_it_is_an_initialize() {
    let pod = Pod::start();
    // The only pod left; the session's home is gone and nobody else could hold it.
    let alone = Snapshot {
        peers: vec![peer("pod-a", PeerState::Routable)],
    };
    assert!(pod.sink.publish(Source::PeersFile, alone));
    let id = pod.mint("pod-z").0;
    let no_holder = Rejection::SessionNotFound(NotFound::NoHolder);
    // Until membership's source confirms its view, nobody can say the session is lost: 503.
    let (lane, _) = pod
        .decide(&head(Method::GET, Some(&id)), &mut Sent::default())
        .await;
    assert_eq!(refused(lane), (Rejection::PeerUnavailable, false));
    pod.sink.confirm();
    // A GET or DELETE needs no body to be refused.
    let mut body = Sent::default();
    let (lane, _) = pod.decide(&head(Method::GET, Some(&id)), &mut body).await;
    assert_eq!(refused(lane), (no_holder.clone(), false));
    // A POST's body decides.
    let mut body = Sent::json(&call(1));
    let (lane, _) = pod.decide(&head(Method::POST, Some(&id)), &mut body).await;
    assert_eq!(refused(lane), (no_holder, false));
    assert_eq!(body.read, 1);
    let (lane, _) = pod
        .decide(
            &head(Method::POST, Some(&id)),
            &mut Sent::json(&initialize()),
        )
        .await;
    assert!(
        matches!(lane, Lane::Session { entered: None, .. }),
        "{lane:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_session_homed_here_but_not_held_is_left_to_the_broker() {
    let pod = Pod::start();
    let id = pod.mint("pod-a").0;
    let (lane, _) = pod
        .decide(&head(Method::GET, Some(&id)), &mut Sent::default())
        .await;
    // The broker answers it (404 `unknown`, or `deleted` for a session it ended).
    assert!(
        matches!(lane, Lane::Session { entered: None, .. }),
        "{lane:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_forged_session_id_is_404_at_once() {
    let pod = Pod::start();
    let mut forged = pod.mint("pod-b").0;
    forged.replace_range(forged.len() - 4.., "AAAA");
    let mut body = Sent::json(&initialize());
    let (lane, _) = pod
        .decide(&head(Method::GET, Some(&forged)), &mut body)
        .await;
    assert_eq!(
        refused(lane).0,
        Rejection::SessionNotFound(NotFound::Forged)
    );
}

#[tokio::test(start_paused = true)]
async fn a_body_over_the_limit_or_broken_off_is_refused_and_the_connection_closes() {
    let pod = Pod::start();
    let mut large = Sent {
        chunks: VecDeque::from([Bytes::from(vec![b' '; 3000]), Bytes::from(vec![b' '; 3000])]),
        ..Sent::default()
    };
    let (lane, _) = pod.decide(&head(Method::POST, None), &mut large).await;
    assert_eq!(refused(lane), (Rejection::PayloadTooLarge(4096), true));
    let mut broken = Sent {
        chunks: VecDeque::from([Bytes::from_static(b"{")]),
        breaks: true,
        ..Sent::default()
    };
    let (lane, _) = pod.decide(&head(Method::POST, None), &mut broken).await;
    let (rejection, close) = refused(lane);
    assert!(
        matches!(rejection, Rejection::InvalidRequest(_)),
        "{rejection:?}"
    );
    assert!(close);
}

#[tokio::test(start_paused = true)]
async fn a_body_that_never_ends_is_408_after_the_body_timeout() {
    struct Stalled;
    #[async_trait::async_trait]
    impl BodySource for Stalled {
        async fn chunk(&mut self) -> Result<Option<Bytes>, ()> {
            std::future::pending().await
        }
        fn keep_for_resend(&mut self) {}
        fn too_large_to_resend(&self) -> bool {
            false
        }
    }
    let pod = Pod::start();
    let started = tokio::time::Instant::now();
    let (lane, _) = pod
        .lanes()
        .decide(&head(Method::POST, None), &mut Stalled)
        .await;
    assert_eq!(refused(lane), (Rejection::RequestTimeout, true));
    assert_eq!(started.elapsed(), Duration::from_secs(10));
}

#[tokio::test(start_paused = true)]
async fn p05_a_stateless_request_is_checked_against_its_headers_and_served_here() {
    let pod = Pod::start();
    let (lane, _) = pod
        .decide(&stateless("tools/call"), &mut Sent::json(&call(7)))
        .await;
    match lane {
        Lane::Stateless { request, .. } => assert!(request.envelope.is_some()),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        pod.counted("tether_requests_total"),
        [r#"tether_requests_total{method="POST",era="stateless"} 1"#]
    );
    // `Mcp-Method` that is not the body's: 400 with the request's id.
    let (lane, _) = pod
        .decide(&stateless("tools/list"), &mut Sent::json(&call(8)))
        .await;
    match lane {
        Lane::Refuse(refusal) => {
            assert!(matches!(refusal.rejection, Rejection::HeaderMismatch(_)));
            assert_eq!(refusal.id.unwrap().as_json(), "8");
            assert!(!refusal.close);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_stateless_request_on_a_draining_pod_is_placed_at_most_once() {
    let pod = Pod::start();
    assert!(pod.lifecycle.start_draining());
    let mut body = Sent::json(&call(7));
    let (lane, _) = pod.decide(&stateless("tools/call"), &mut body).await;
    let (to, kind, at_most_once) = forwarded(lane);
    assert_ne!(to, "pod-a");
    assert_eq!((kind, at_most_once), (ForwardKind::Placement, true));
    // `tools/call` may be answered with an input request: its retry could carry a
    // `requestState`, so its body is read first and kept for the forward.
    assert!(body.kept_for_resend);
    assert_eq!(body.read, 1);
}
