//! The messages of the peer protocol (`docs/design/peer-protocol.md#messages`): JSON bodies of
//! `POST /v2/sessions` (a session pushed to its new holder), `POST /v2/tail` (events of a
//! handed-off stream that arrived after the push), `POST /v2/cancel`, `POST /v2/held` and
//! `POST /v2/about` (what a sidecar reports of itself, asked and answered alike), `POST
//! /v2/replicas` and `POST /v2/claim` (replication). Optional
//! fields are left out when empty, false or zero.
//!
//! Event data travels as text (SSE `data:` is UTF-8 by definition); request ids as their
//! JSON text ([`RequestKey`]); stream keys in their 12-character form ([`StreamKey`], checked on
//! decode). Unknown fields are refused, so a peer speaking a different version fails loudly
//! instead of half-applying a message.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::mcp::cursor::StreamKey;
use crate::mcp::jsonrpc::RequestKey;

/// `POST /v2/sessions`: a session handed to the receiver, which answers 200 once it holds it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct SessionPush {
    /// UID of the sending pod (the holder until the receiver acknowledges).
    pub(crate) from: String,
    /// The session.
    pub(crate) session: SessionImage,
}

/// Everything a pod needs to serve a session it did not create
/// (`docs/design/peer-protocol.md#post-v2sessions`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct SessionImage {
    /// The client session id (MAC-checked by the receiver).
    pub(crate) id: String,
    /// The negotiated protocol version, e.g. `2025-11-25`.
    pub(crate) version: String,
    /// The journal the receiver rebuilds the upstream session from (`migration: Replay`).
    pub(crate) journal: JournalImage,
    /// Retry records: request id → body digest and the stream carrying its response.
    pub(crate) requests: Vec<RequestImage>,
    /// Every stream the session keeps (live ones, completed ones and tombstones).
    pub(crate) streams: Vec<StreamImage>,
    /// The upstream's answer to a standalone `GET` when it offers none (replayed to clients).
    pub(crate) standalone_unsupported: Option<ReplyImage>,
    /// The session's clients presented credentials (never the credentials themselves): the
    /// receiver waits for the session's next request to rebuild it with that request's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) credentialed: bool,
    /// The principal the session is bound to (`spec.auth.binding`): `subject:<hex digest>`,
    /// `credential:<hex digest>`, or `subject:anonymous`; left out for an unbound session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) binding: Option<String>,
    /// Credentials the MCP server accepted for the session (`spec.auth.revalidate`), as keyed
    /// digests, never the credentials: the receiver serves answers from memory to them for the
    /// rest of the window, as the sender would have. Left out when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) accepted: Vec<AcceptedImage>,
    /// The push's handoff epoch (`docs/design/handoff.md#one-holder-per-session`): a receiver
    /// holding the session at a later epoch refuses it, one holding an earlier copy replaces
    /// it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) epoch: u64,
    /// The ids of requests the session answered and forgot, whose retries get "no longer
    /// available": left out when there are none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) tombstones: Option<TombstonesImage>,
}

/// A session's tombstones (`docs/design/peer-protocol.md#post-v2sessions`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct TombstonesImage {
    /// The session's key of the digests, 16 bytes in hex; never shown to its clients.
    pub(crate) key: String,
    /// The session reuses request ids: a buried id is a new request, not a retry.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) reuses_ids: bool,
    /// Integer ids, as ranges: `[first, last, ms left]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) ranges: Vec<(i64, i64, u64)>,
    /// Keyed digests of the other ids: `[digest, ms left]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) ids: Vec<(u64, u64)>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A credential the MCP server accepted for a session.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct AcceptedImage {
    /// Hex of the credential's keyed digest (HMAC-SHA256, domain `tether/principal/v1`, 16
    /// bytes).
    pub(crate) credential: String,
    /// Milliseconds since the MCP server accepted it, at the sender.
    pub(crate) age_ms: u64,
}

/// The session journal: what rebuilds the upstream session on the receiver.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct JournalImage {
    /// The `initialize` request as sent upstream.
    pub(crate) initialize: Value,
    /// Whether `notifications/initialized` was sent.
    pub(crate) initialized: bool,
    /// The params of the last `logging/setLevel`.
    pub(crate) log_level: Option<Value>,
    /// The params of each `resources/subscribe` in force, by URI.
    pub(crate) subscriptions: BTreeMap<String, Value>,
}

/// One retry record (`docs/design/architecture.md#vocabulary`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RequestImage {
    /// The JSON-RPC request id.
    pub(crate) id: RequestKey,
    /// Hex SHA-256 of the POST body that carried it.
    pub(crate) digest: String,
    /// The stream carrying its response.
    pub(crate) stream: StreamKey,
}

/// What a stream carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) enum KindImage {
    /// The response stream of a POST with one request.
    Post,
    /// The response stream of a 2025-03-26 batch.
    Batch,
    /// A standalone GET stream.
    Standalone,
}

/// One stream: its state and (some of) its buffered events.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct StreamImage {
    /// The stream key (the first part of its event ids).
    pub(crate) key: StreamKey,
    /// What it carries.
    pub(crate) kind: KindImage,
    /// Requests still waiting for their response.
    pub(crate) pending: Vec<RequestKey>,
    /// No more events will come, and every event is in this message or was sent before.
    pub(crate) complete: bool,
    /// The upstream's non-SSE answer to the POST, when it gave one.
    pub(crate) stored: Option<ReplyImage>,
    /// The end-to-end headers of the upstream's SSE answer, when it gave one.
    pub(crate) sse: Option<Vec<(String, String)>>,
    /// Sequence of the newest event or reserved (priming) number at the sender.
    pub(crate) last_seq: u64,
    /// Events at or below this sequence were evicted at the sender.
    pub(crate) evicted_through: u64,
    /// Buffered events after the receiver's position, oldest first.
    pub(crate) events: Vec<EventImage>,
    /// The POST's request was not carried out (refused for its caller, or never received by
    /// the MCP server): `stored` answers whoever waits for it, no retry record leads to the
    /// stream any more, and a retry of its request is dispatched again. Left out when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) withdrawn: bool,
}

/// One buffered SSE event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct EventImage {
    /// Sequence number on its stream (the event id is `<key>-<seq>`).
    pub(crate) seq: u64,
    /// The SSE `event:` field, if any.
    pub(crate) event: Option<String>,
    /// The SSE `data:` payload (a JSON-RPC message).
    pub(crate) data: String,
}

/// An upstream's non-SSE answer (status, replayable headers, body as text).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct ReplyImage {
    /// HTTP status.
    pub(crate) status: u16,
    /// Replayable end-to-end headers.
    pub(crate) headers: Vec<(String, String)>,
    /// Body (JSON text or empty).
    pub(crate) body: String,
}

/// `POST /v2/tail`: what happened on streams of a handed-off session since the last message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct TailPush {
    /// UID of the sending pod.
    pub(crate) from: String,
    /// The client session id.
    pub(crate) session: String,
    /// Streams with new events or a new state; a stream the receiver does not know yet is
    /// created from its image.
    pub(crate) streams: Vec<StreamImage>,
    /// Retry records of streams the receiver does not know yet.
    pub(crate) requests: Vec<RequestImage>,
}

/// `POST /v2/held`: whether the receiver holds a session at an epoch, asked by a sender whose
/// push of it got no acknowledgement (a lost answer, a timeout) before it tries another pod.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct HeldQuery {
    /// UID of the asking pod.
    pub(crate) from: String,
    /// The client session id.
    pub(crate) session: String,
    /// The epoch of the push in doubt.
    pub(crate) epoch: u64,
}

/// `POST /v2/replicas`: replicas of sessions the sender holds, kept by the receiver, its
/// replica pod (`docs/design/replication.md`), and replicas it no longer keeps there.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct ReplicasPush {
    /// UID of the sending pod, the sessions' holder.
    pub(crate) from: String,
    /// Replicas, each whole or as the change to the copy the receiver keeps.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) replicas: Vec<ReplicaUpdate>,
    /// Replicas to drop: the session ended, or its replica pod is another now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) drops: Vec<ReplicaDrop>,
}

/// One session's replica: whole, or the change that brings the copy the receiver keeps from
/// mark `base` to mark `mark` (`docs/design/replication.md#keeping-a-replica-current`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct ReplicaUpdate {
    /// The holder's mark of the copy once this is applied: the base of the next change.
    pub(crate) mark: u64,
    /// A change applies only to a copy at this mark (of the same holder and epoch); the
    /// replica is whole when it is left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) base: Option<u64>,
    /// The session at its epoch: whole, or (a change) with only its streams that are new or
    /// changed and its retry records that are new; everything else in it replaces the copy's.
    pub(crate) image: SessionImage,
    /// (A change) Streams the copy no longer keeps: the holder forgot them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) forgotten_streams: Vec<StreamKey>,
    /// (A change) Retry records the copy no longer keeps.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) forgotten_requests: Vec<RequestKey>,
}

/// A replica the receiver drops.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct ReplicaDrop {
    /// The client session id.
    pub(crate) session: String,
    /// The epoch the sender holds it at: a replica of a later epoch is not dropped.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) epoch: u64,
}

/// The answer to [`ReplicasPush`]: what became of each replica, in the message's order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct ReplicasAnswer {
    /// One per replica of the message.
    pub(crate) results: Vec<ReplicaOutcome>,
    /// The receiver's store of replicas, drawn at random when its sidecar started: another
    /// value than before means it restarted and keeps none of the sender's replicas.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) incarnation: u64,
}

/// What became of one replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ReplicaOutcome {
    /// Kept: the receiver can serve the session if the sender is lost.
    Kept,
    /// The receiver has the session at a later epoch (held, or a replica of another holder):
    /// the sender's copy is stale.
    StaleEpoch,
    /// The receiver's budget has no room for it.
    Full,
    /// The receiver drains and keeps no replica.
    Draining,
    /// The session ended on the receiver; it is never kept again.
    Ended,
    /// The image cannot be used (a forged id, an unknown version…).
    Invalid,
    /// The sender is not an alive pod of the receiver's membership: a replica of it could be
    /// promoted while it still serves the session (the receiver's view lags).
    NotMember,
    /// A change whose base is not the copy the receiver keeps (it has none, or another): the
    /// sender sends the replica whole.
    Behind,
}

/// `POST /v2/claim`: a pod that lost its memory (its sidecar restarted) asks the replica pod of
/// a session it held for the session back.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct ClaimQuery {
    /// UID of the asking pod: the replica's holder.
    pub(crate) from: String,
    /// The client session id.
    pub(crate) session: String,
}

/// The answer to [`ClaimQuery`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct ClaimAnswer {
    /// The replica, handed back to its holder, which takes it at the next epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) session: Option<SessionImage>,
    /// The receiver holds the session itself (it promoted the replica): the asker forwards
    /// the session's requests to it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) held: bool,
}

/// `POST /v2/about` and its answer: what a sidecar reports of itself (its revision, start and
/// ports; `docs/design/routing.md#what-a-peer-reports`). The asker sends its own, the receiver
/// answers with its own.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct About {
    /// UID of the pod the report is about (the sender of the message, or of the answer).
    pub(crate) from: String,
    /// Its revision (`pod-template-hash`), empty when unknown.
    pub(crate) revision: String,
    /// When its sidecar started, Unix time in milliseconds.
    pub(crate) started_ms: u64,
    /// Its MCP listener's port.
    pub(crate) listen_port: u16,
    /// Its peer port.
    pub(crate) peer_port: u16,
}

/// The answer to a [`HeldQuery`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct HeldAnswer {
    /// The receiver took the session at that epoch or a later one (it holds it, or handed it
    /// on).
    pub(crate) held: bool,
}

/// `POST /v2/cancel`: a client cancelled (spec L-02) a request that still runs at the pod that
/// handed the session off; that pod sends the notification to its upstream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct CancelPush {
    /// UID of the sending pod (the new holder).
    pub(crate) from: String,
    /// The client session id.
    pub(crate) session: String,
    /// The cancelled request.
    pub(crate) request: RequestKey,
    /// The client's `notifications/cancelled` message.
    pub(crate) notification: serde_json::Value,
    /// The canceller's credential headers (lowercase name, value; at most
    /// [`MAX_CANCEL_CREDENTIALS`], names among the receiver's `spec.auth.forwardHeaders`): the
    /// cancellation reaches the MCP server with them, never with the session's own.
    #[serde(default, skip_serializing_if = "Credentials::is_empty")]
    pub(crate) credentials: Credentials,
}

/// Credential headers (lowercase name, value) carried by a [`CancelPush`]; their `Debug` shows
/// the names only, so a logged message never shows a credential.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct Credentials(pub(crate) Vec<(String, String)>);

impl Credentials {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(name, _)| name))
            .finish()
    }
}

/// Most credential headers a [`CancelPush`] carries (`spec.auth.forwardHeaders` lists at most
/// 16 names).
pub(crate) const MAX_CANCEL_CREDENTIALS: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn a_session_round_trips_and_unknown_fields_are_refused() {
        let push = SessionPush {
            from: "pod-a".into(),
            session: SessionImage {
                id: "id".into(),
                version: "2025-11-25".into(),
                journal: JournalImage {
                    initialize: json!({"jsonrpc":"2.0","id":1,"method":"initialize"}),
                    initialized: false,
                    log_level: None,
                    subscriptions: BTreeMap::new(),
                },
                requests: vec![RequestImage {
                    id: RequestKey::of(&json!(7)),
                    digest: "00".into(),
                    stream: StreamKey::random(),
                }],
                streams: vec![StreamImage {
                    key: StreamKey::random(),
                    kind: KindImage::Post,
                    pending: vec![RequestKey::of(&json!("x"))],
                    complete: false,
                    stored: None,
                    sse: Some(vec![("content-type".into(), "text/event-stream".into())]),
                    last_seq: 3,
                    evicted_through: 1,
                    events: vec![EventImage {
                        seq: 2,
                        event: None,
                        data: "{}".into(),
                    }],
                    withdrawn: true,
                }],
                standalone_unsupported: None,
                credentialed: true,
                binding: None,
                accepted: vec![AcceptedImage {
                    credential: "ab".repeat(16),
                    age_ms: 1500,
                }],
                epoch: 3,
                tombstones: Some(TombstonesImage {
                    key: "cd".repeat(16),
                    reuses_ids: true,
                    ranges: vec![(1, 40, 9_000)],
                    ids: vec![(u64::MAX, 500)],
                }),
            },
        };
        let text = serde_json::to_string(&push).unwrap();
        assert_eq!(serde_json::from_str::<SessionPush>(&text).unwrap(), push);
        let mut v: Value = serde_json::from_str(&text).unwrap();
        v["session"]["extra"] = json!(1);
        assert!(serde_json::from_value::<SessionPush>(v).is_err());
        let bad_key = text.replace(&push.session.streams[0].key.to_string(), "NOT-A-KEY");
        assert!(serde_json::from_str::<SessionPush>(&bad_key).is_err());
        // An anonymous, unbound session's image is the first version's: a receiver of that
        // version reads it.
        let mut anonymous = push.session;
        anonymous.credentialed = false;
        anonymous.accepted.clear();
        anonymous.streams[0].withdrawn = false;
        anonymous.epoch = 0;
        let v = serde_json::to_value(&anonymous).unwrap();
        for field in ["credentialed", "binding", "accepted", "epoch"] {
            assert!(v.get(field).is_none(), "{field} left out: {v}");
        }
        assert!(v["streams"][0].get("withdrawn").is_none(), "{v}");
    }

    #[test]
    fn a_cancellations_credentials_travel_but_never_show_in_debug() {
        let push = CancelPush {
            from: "b".into(),
            session: "s".into(),
            request: RequestKey::of(&json!(2)),
            notification: json!({"method": "notifications/cancelled"}),
            credentials: Credentials(vec![("authorization".into(), "Bearer secret".into())]),
        };
        let text = serde_json::to_string(&push).unwrap();
        assert!(
            text.contains(r#""credentials":[["authorization","Bearer secret"]]"#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<CancelPush>(&text).unwrap(), push);
        let shown = format!("{push:?}");
        assert!(
            shown.contains("authorization") && !shown.contains("secret"),
            "{shown}"
        );
        let anonymous = CancelPush {
            credentials: Credentials::default(),
            ..push
        };
        assert!(
            !serde_json::to_string(&anonymous)
                .unwrap()
                .contains("credentials")
        );
    }
}
