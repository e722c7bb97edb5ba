//! The sidecar's face for its fuzz targets (`fuzz/`, `docs/dev/testing.md#fuzzing`): compiled
//! only with `--cfg fuzzing`, which `cargo fuzz` sets, and never part of a normal build.
//!
//! The crate's parsers and framing are `pub(crate)`; this module wraps exactly the pieces the
//! targets drive, in plain types (strings, bytes, numbers) so the targets can check what the
//! sidecar did against what it must do:
//!
//! - event ids and `Last-Event-ID` cursors ([`parse_cursor`], [`format_cursor`]);
//! - client session ids ([`Minter`], [`session_id_mac`]);
//! - task ids and where they travel in messages ([`TaskCodec`]);
//! - JSON-RPC envelopes ([`parse_envelope`], [`response_id`]);
//! - upstream SSE as the pump consumes it ([`decode_upstream`], [`UpstreamRelay`]) and the
//!   frames the sidecar writes to clients ([`frame_event`], [`frame_priming`], [`frame_retry`]);
//! - peer messages, decoded and adopted as the peer listener does ([`wire_round_trip`],
//!   [`adopt`]);
//! - the peers file and the routing view built from it ([`parse_peers`], [`Routing`]);
//! - what the sidecar makes of an accepted endpoint manifest ([`endpoint_policy`]).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use http::{HeaderMap, HeaderValue, header};
use http_body_util::StreamBody;
use hyper::body::Frame;
use serde_json::Value;
use tether_crds::McpEndpointSpec;

use crate::broker::UpstreamCursor;
use crate::cluster::membership::peers_file::{self, PeersFileError};
use crate::cluster::membership::{Peer, PeerState, Snapshot, View};
use crate::keys::{DOMAIN_SESSION_ID, Key, KeyRing};
use crate::mcp::cursor::{EventId, StreamKey};
use crate::mcp::home::HomeToken;
use crate::mcp::jsonrpc::{self, EnvelopeError, EnvelopeLimits, Message};
use crate::mcp::origin::{OriginCheck, OriginPolicy};
use crate::mcp::principal::Owner;
use crate::mcp::sealed::{Sealer, TASK_ID};
use crate::mcp::session_id::{IdError, IdMinter};
use crate::mcp::sse;
use crate::mcp::tasks;

pub use crate::handoff::fuzzing::{Adopted, PeerMessage, RestoredStream, WireTrip};

// ---- event ids and cursors -------------------------------------------------------------------

/// Longest `Last-Event-ID` value the sidecar accepts, in bytes.
pub const MAX_CURSOR_LEN: usize = crate::mcp::cursor::MAX_CURSOR_LEN;

/// An event id: the stream's key and the event's sequence number on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cursor {
    /// The stream key (12 characters of lowercase base32).
    pub stream: String,
    /// The sequence number.
    pub seq: u64,
}

/// `Last-Event-ID` as the sidecar parses it; `None` where it answers "malformed".
pub fn parse_cursor(value: &str) -> Option<Cursor> {
    EventId::parse(value).ok().map(|id| Cursor {
        stream: id.stream.to_string(),
        seq: id.seq,
    })
}

/// The event id the sidecar writes for event `seq` of stream `stream`; `None` when `stream` is
/// no stream key.
pub fn format_cursor(stream: &str, seq: u64) -> Option<String> {
    let stream = StreamKey::try_from(stream.to_owned()).ok()?;
    Some(EventId { stream, seq }.to_string())
}

/// A fresh stream key, as a new stream gets.
pub fn random_stream_key() -> String {
    StreamKey::random().to_string()
}

// ---- session ids -----------------------------------------------------------------------------

/// Length of a session id (it names its key), in characters.
pub const SESSION_ID_LEN: usize = crate::mcp::session_id::ENCODED_LEN;
/// The format version in the first byte of a session id.
pub const SESSION_ID_VERSION: u8 = crate::mcp::session_id::ID_VERSION;

/// The id of the key `secret` (4 bytes), as a session id carries it.
pub fn key_id(secret: &[u8]) -> [u8; 4] {
    Key::new(secret.to_vec()).id().0
}

/// Why the sidecar refuses a presented session id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdRejection {
    /// Wrong length or not base64url.
    Malformed,
    /// A format version the sidecar does not know.
    UnknownVersion,
    /// The MAC does not match.
    BadMac,
}

/// The session-id minter of one pod of one endpoint.
#[derive(Clone, Debug)]
pub struct Minter(IdMinter);

impl Minter {
    /// The minter of pod `pod_uid` with endpoint secret `secret`.
    pub fn new(secret: &[u8], pod_uid: &str) -> Self {
        Self(IdMinter::new(
            KeyRing::from_bytes(secret.to_vec()),
            HomeToken::for_pod(pod_uid),
        ))
    }

    /// A fresh session id.
    pub fn mint(&self) -> String {
        self.0.mint().0
    }

    /// The home token of a genuine id, or why it is refused.
    ///
    /// # Errors
    /// [`IdRejection`] for an id that is not one of this endpoint's.
    pub fn verify(&self, id: &str) -> Result<[u8; 8], IdRejection> {
        self.0.verify(id).map(|v| v.home.0).map_err(|e| match e {
            IdError::Malformed => IdRejection::Malformed,
            IdError::UnknownVersion => IdRejection::UnknownVersion,
            IdError::BadMac => IdRejection::BadMac,
        })
    }
}

/// Task ids of one pod, sealed with an endpoint secret (`mcp/sealed.rs`) for anonymous
/// requests, and their exchange in messages (`mcp/tasks.rs`).
pub struct TaskCodec(Sealer);

impl TaskCodec {
    /// The task ids of the pod whose home token is `home`, under `secret`.
    pub fn new(secret: &[u8], home: [u8; 8]) -> Self {
        Self(Sealer::new(
            KeyRing::from_bytes(secret.to_vec()),
            HomeToken(home),
            &TASK_ID,
        ))
    }

    /// The client's id for the MCP server's `upstream` id; `None` when it is too long.
    pub fn mint(&self, upstream: &str) -> Option<String> {
        self.0.mint(upstream, &Owner::ANONYMOUS).ok()
    }

    /// The home token and the MCP server's id a client's id opens to.
    pub fn open(&self, id: &str) -> Option<([u8; 8], String)> {
        self.0
            .open(id, &Owner::ANONYMOUS)
            .ok()
            .map(|t| (t.home.0, t.upstream))
    }

    /// Seals a server message's task ids in place: whether it changed (`Err` for an id too
    /// long to seal), and the server ids of the task objects seen.
    pub fn seal(&self, message: &mut Value) -> (Result<bool, ()>, Vec<String>) {
        let mut seen = Vec::new();
        let sealed = tasks::seal(message, &self.0, &Owner::ANONYMOUS, &mut |t| {
            seen.push(t.upstream);
        });
        (sealed.map_err(|_| ()), seen)
    }

    /// Opens a client message's task ids in place (a session's message when `session`): the
    /// server's id of the task a `tasks/*` request names, or `Err` for an id not this pod's.
    pub fn open_message(&self, message: &mut Value, session: bool) -> Result<Option<String>, ()> {
        let revision = if session {
            tasks::Revision::Session
        } else {
            tasks::Revision::Extension
        };
        tasks::open(message, &self.0, self.0.home(), revision, &Owner::ANONYMOUS)
            .map(|t| t.map(|t| t.upstream))
            .map_err(|_| ())
    }
}

/// The home token of pod `pod_uid` (the 8 bytes a session id carries).
pub fn home_token(pod_uid: &str) -> [u8; 8] {
    HomeToken::for_pod(pod_uid).0
}

/// The full HMAC the session-id MAC is truncated from, over `signed` (version, random, home).
pub fn session_id_mac(secret: &[u8], signed: &[u8]) -> [u8; 32] {
    Key::new(secret.to_vec()).mac(DOMAIN_SESSION_ID, signed)
}

// ---- JSON-RPC envelopes ----------------------------------------------------------------------

/// Longest request id, in bytes of its JSON text.
pub const MAX_ID_BYTES: usize = jsonrpc::MAX_ID_BYTES;

/// One message of a POST body as the sidecar classified it, with its JSON value.
#[derive(Clone, Debug, PartialEq)]
pub enum Classified {
    /// A request.
    Request {
        /// Its id as JSON text (the retry-record key).
        id: String,
        /// Its method.
        method: String,
        /// The message.
        raw: Value,
    },
    /// A notification.
    Notification {
        /// Its method.
        method: String,
        /// Its params (`null` when absent).
        params: Value,
        /// The message.
        raw: Value,
    },
    /// A response or error to a server-initiated request.
    Response {
        /// The message.
        raw: Value,
    },
}

/// A POST body the sidecar accepts.
#[derive(Clone, Debug, PartialEq)]
pub struct Envelope {
    /// Whether the body was a JSON array.
    pub batch: bool,
    /// The messages, in order.
    pub messages: Vec<Classified>,
    /// SHA-256 of the body's canonical JSON.
    pub digest: [u8; 32],
    /// The request ids, in order (JSON text).
    pub request_ids: Vec<String>,
    /// Whether the body is a single `initialize` request.
    pub is_initialize: bool,
    /// Whether any message is `initialize`.
    pub contains_initialize: bool,
}

/// Why the sidecar refuses a POST body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EnvelopeRejection {
    /// Not JSON (JSON-RPC -32700), with the message.
    Parse(String),
    /// Not a JSON-RPC message or batch of them (-32600), with the message.
    Invalid(String),
}

/// A POST body as the sidecar parses it with `--max-batch` `max_batch`.
///
/// # Errors
/// [`EnvelopeRejection`] where the sidecar refuses the body.
pub fn parse_envelope(body: &[u8], max_batch: usize) -> Result<Envelope, EnvelopeRejection> {
    let envelope =
        jsonrpc::Envelope::parse(body, EnvelopeLimits { max_batch }).map_err(|e| match e {
            EnvelopeError::Parse(m) => EnvelopeRejection::Parse(m),
            EnvelopeError::Invalid(m) => EnvelopeRejection::Invalid(m),
        })?;
    Ok(Envelope {
        batch: envelope.batch,
        request_ids: envelope
            .request_ids()
            .iter()
            .map(|k| k.as_json().to_owned())
            .collect(),
        is_initialize: envelope.is_initialize(),
        contains_initialize: envelope.contains_initialize(),
        digest: envelope.digest,
        messages: envelope
            .messages
            .into_iter()
            .map(|(message, raw)| match message {
                Message::Request { id, method } => Classified::Request {
                    id: id.as_json().to_owned(),
                    method,
                    raw,
                },
                Message::Notification { method, params } => Classified::Notification {
                    method,
                    params,
                    raw,
                },
                Message::Response => Classified::Response { raw },
            })
            .collect(),
    })
}

/// Whether the sidecar takes `body` for a batch before parsing it.
pub fn is_batch(body: &[u8]) -> bool {
    jsonrpc::is_batch(body)
}

/// The retry-record key of a JSON id value.
pub fn request_key(id: &Value) -> String {
    jsonrpc::RequestKey::of(id).as_json().to_owned()
}

/// The id of the request an upstream message answers (JSON text), when it is a response.
pub fn response_id(data: &[u8]) -> Option<String> {
    jsonrpc::response_id(data).map(|k| k.as_json().to_owned())
}

// ---- SSE -------------------------------------------------------------------------------------

/// The keep-alive comment written on idle streams.
pub const KEEP_ALIVE: &[u8] = sse::KEEP_ALIVE;

/// An upstream SSE body delivered in `chunks`, decoded as the pump decodes it: every block up to
/// the end, or up to and including the first error (after which the decoder ends); no event
/// size bound.
pub fn decode_upstream(chunks: &[&[u8]]) -> Vec<Result<sse_stream::Sse, String>> {
    decode_upstream_within(chunks, usize::MAX)
}

/// [`decode_upstream`] with the pump's event size bound (`--max-event-bytes`) at
/// `max_event_bytes`.
pub fn decode_upstream_within(
    chunks: &[&[u8]],
    max_event_bytes: usize,
) -> Vec<Result<sse_stream::Sse, String>> {
    let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = chunks
        .iter()
        .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
        .collect();
    let body = StreamBody::new(futures::stream::iter(frames));
    futures::executor::block_on(
        crate::upstream::events(body, max_event_bytes)
            .map(|r| r.map_err(|e| e.to_string()))
            .collect(),
    )
}

/// The pump's view of one upstream stream: which decoded events become messages of the
/// client's stream, and where a resume would start.
#[derive(Debug, Default)]
pub struct UpstreamRelay(UpstreamCursor);

impl UpstreamRelay {
    /// A relay at the start of an upstream stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// What the pump appends to the client's stream for `ev`: the `event` field and the data.
    pub fn take(&mut self, ev: sse_stream::Sse) -> Option<(Option<String>, Vec<u8>)> {
        self.0.take(ev).map(|(event, data)| (event, data.to_vec()))
    }

    /// The `Last-Event-ID` a resume would send.
    pub fn last_id(&self) -> Option<&str> {
        self.0.last_id()
    }

    /// The upstream's newest `retry` hint, in milliseconds.
    pub fn retry_ms(&self) -> Option<u128> {
        self.0.retry().map(|d| d.as_millis())
    }
}

/// Appends the frame the sidecar writes to a client for event `seq` of stream `stream`;
/// `false` (nothing written) when `stream` is no stream key.
pub fn frame_event(
    out: &mut Vec<u8>,
    stream: &str,
    seq: u64,
    event: Option<&str>,
    data: &[u8],
) -> bool {
    let Ok(stream) = StreamKey::try_from(stream.to_owned()) else {
        return false;
    };
    let mut frame = BytesMut::new();
    sse::put_event(&mut frame, &EventId { stream, seq }, event, data);
    out.extend_from_slice(&frame);
    true
}

/// The priming event for position `seq` of stream `stream`, with an optional `retry` hint.
pub fn frame_priming(stream: &str, seq: u64, retry_ms: Option<u64>) -> Option<Vec<u8>> {
    let stream = StreamKey::try_from(stream.to_owned()).ok()?;
    let retry = retry_ms.map(Duration::from_millis);
    Some(sse::priming(&EventId { stream, seq }, retry).to_vec())
}

/// A frame with only a `retry` hint.
pub fn frame_retry(ms: u64) -> Vec<u8> {
    sse::retry(Duration::from_millis(ms)).to_vec()
}

// ---- peer messages ---------------------------------------------------------------------------

/// A peer message body decoded as the peer listener decodes it, re-encoded, decoded again and
/// re-encoded again; `None` when the listener refuses the body as malformed.
pub fn wire_round_trip(kind: PeerMessage, body: &[u8]) -> Option<WireTrip> {
    crate::handoff::fuzzing::wire_round_trip(kind, body)
}

/// A `POST /v2/sessions` body adopted as the receiving pod adopts it, then, when `input` holds a
/// NUL byte, the `POST /v2/tail` body after it applied, and the adopted session read back (see
/// [`Adopted`]).
///
/// # Errors
/// Why the pod refuses the push (malformed JSON, an unknown version).
pub fn adopt(input: &[u8]) -> Result<Adopted, String> {
    crate::handoff::fuzzing::adopt(input)
}

// ---- the peers file --------------------------------------------------------------------------

/// Why the sidecar refuses a peers file: the error's kind and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeersRejection {
    /// `syntax`, `empty`, `invalid_uid`, `duplicate_uid` (or `read`).
    pub kind: &'static str,
    /// The message the sidecar logs.
    pub message: String,
}

/// A peers file's text as the sidecar parses it.
///
/// # Errors
/// [`PeersRejection`] where the sidecar keeps its last good membership instead.
pub fn parse_peers(text: &str) -> Result<Vec<Peer>, PeersRejection> {
    peers_file::parse(text)
        .map(|snapshot| snapshot.peers)
        .map_err(|e| PeersRejection {
            kind: match &e {
                PeersFileError::Read { .. } => "read",
                PeersFileError::Syntax(_) => "syntax",
                PeersFileError::Empty => "empty",
                PeersFileError::InvalidUid(_) => "invalid_uid",
                PeersFileError::DuplicateUid { .. } => "duplicate_uid",
            },
            message: e.to_string(),
        })
}

/// Whether the sidecar takes `uid` for a pod UID.
pub fn valid_uid(uid: &str) -> bool {
    peers_file::valid_uid(uid)
}

/// A peers file listing `peers` (every field written out).
pub fn print_peers(peers: &[Peer]) -> String {
    #[derive(serde::Serialize)]
    struct Entry<'a> {
        uid: &'a str,
        name: &'a str,
        address: SocketAddr,
        state: PeerState,
        revision: &'a str,
    }
    let entries: Vec<Entry<'_>> = peers
        .iter()
        .map(|p| Entry {
            uid: &p.uid,
            name: &p.name,
            address: p.address,
            state: p.state,
            revision: &p.revision,
        })
        .collect();
    yaml_serde::to_string(&entries).unwrap_or_default()
}

/// The routing view the sidecar builds from a membership.
#[derive(Debug)]
pub struct Routing(View);

impl Routing {
    /// The view of `peers` (oldest first).
    pub fn new(peers: Vec<Peer>) -> Self {
        Self(View::new(Snapshot { peers }))
    }

    /// The UID of the pod a session id with `pod_uid`'s home token is homed on.
    pub fn home_of(&self, pod_uid: &str) -> Option<String> {
        self.0
            .home(&HomeToken::for_pod(pod_uid))
            .map(|p| p.uid.clone())
    }

    /// `owner(S)` of session key `key`.
    pub fn owner(&self, key: &str) -> Option<Peer> {
        self.0.owner(key).cloned()
    }

    /// `ranked(S)`: every routable or draining pod, in `key`'s order.
    pub fn ranked(&self, key: &str) -> Vec<String> {
        self.0.ranked(key).map(|p| p.uid.clone()).collect()
    }

    /// The order a session whose home is gone is looked for.
    pub fn walk(&self, key: &str) -> Vec<String> {
        self.0.walk(key).map(|p| p.uid.clone()).collect()
    }

    /// The newest revision (of the youngest routable pod).
    pub fn newest_revision(&self) -> Option<String> {
        self.0.snapshot().newest_revision().map(str::to_owned)
    }
}

// ---- the endpoint manifest -------------------------------------------------------------------

/// What the sidecar makes of an endpoint spec for admission.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointPolicy {
    /// Per `spec.origins.allow` entry: whether a request carrying exactly that `Origin` is
    /// admitted (`None`: the entry is no valid header value, so no request can carry it).
    pub origins: Vec<(String, Option<bool>)>,
    /// Whether a request without `Origin` is admitted.
    pub missing_origin_admitted: bool,
    /// The protocol versions the sidecar offers, as it reads `spec.protocolVersions`.
    pub versions: Vec<String>,
}

/// The admission the sidecar derives from `spec` (origins, versions).
pub fn endpoint_policy(spec: &McpEndpointSpec) -> EndpointPolicy {
    let policy = OriginPolicy::new(&spec.origins.allow, spec.origins.allow_missing);
    let origins = spec
        .origins
        .allow
        .iter()
        .map(|o| {
            let admitted = HeaderValue::from_str(o).ok().map(|value| {
                let mut headers = HeaderMap::new();
                headers.insert(header::ORIGIN, value);
                matches!(policy.check(&headers), OriginCheck::Allowed(_))
            });
            (o.clone(), admitted)
        })
        .collect();
    EndpointPolicy {
        origins,
        missing_origin_admitted: policy.check(&HeaderMap::new()) == OriginCheck::Missing,
        versions: crate::config::versions(spec)
            .into_iter()
            .map(|v| v.as_str().to_owned())
            .collect(),
    }
}
