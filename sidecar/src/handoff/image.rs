//! Sessions and streams as handoff images (`docs/design/handoff.md`): the conversions between
//! the state a pod holds ([`SessionSnapshot`], [`StreamSnapshot`]) and the messages of the peer
//! protocol ([`crate::peer::wire`]). It is the only module that knows both, so a new version of the
//! peer protocol changes `handoff/` only.
//!
//! Event data travels as text (SSE `data:` is UTF-8 by definition); retry-record digests as
//! hex; headers as `(name, value)` text pairs. What cannot be decoded (an invalid status or
//! digest, a header that is not visible ASCII, an event name with a line end) is left out, as a
//! sender of an older version could not have produced it. Sequence numbers beyond [`MAX_SEQ`] are refused: no sender
//! numbers that far, and this pod's own numbering after them must not overflow.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use tether_crds::ProtocolVersion;

use crate::keys::Key;
use crate::mcp::principal::{Binding, Principal};
use crate::peer::wire::{
    AcceptedImage, EventImage, JournalImage, KindImage, ReplyImage, RequestImage, SessionImage,
    StreamImage, TombstonesImage,
};
use crate::retained::Retained;
use crate::session::journal::Journal;
use crate::session::{Buried, RetryRecord, Session, SessionSnapshot};
use crate::stream::buffer::BufferLimits;
use crate::stream::{SnapshotEvent, StoredReply, StreamKind, StreamSnapshot};

/// Largest sequence number taken from a peer: 2^53, more events than a stream can number
/// (centuries at a million a second), and far enough below `u64::MAX` that the numbers this pod
/// hands out after it — priming ids, the gap after a dead writer
/// ([`crate::stream::ABANDONED_WRITER_GAP`]) — cannot overflow.
pub(crate) const MAX_SEQ: u64 = 1 << 53;

/// Whether every sequence number of a stream image is at most [`MAX_SEQ`].
fn numbered_within(image: &StreamImage) -> bool {
    image.last_seq <= MAX_SEQ
        && image.evicted_through <= MAX_SEQ
        && image.events.iter().all(|e| e.seq <= MAX_SEQ)
}

/// The image of a session snapshot (the body of `POST /v2/sessions`).
pub(crate) fn session_image(snapshot: &SessionSnapshot) -> SessionImage {
    let (initialize, initialized, log_level, subscriptions) = snapshot.journal.parts();
    SessionImage {
        id: snapshot.id.clone(),
        version: snapshot.version.as_str().to_owned(),
        journal: JournalImage {
            initialize,
            initialized,
            log_level,
            subscriptions,
        },
        requests: request_images(&snapshot.records),
        streams: snapshot.streams.iter().map(stream_image).collect(),
        standalone_unsupported: snapshot.standalone_unsupported.as_ref().map(reply_image),
        credentialed: snapshot.credentialed,
        binding: snapshot.binding.map(Binding::to_image),
        accepted: snapshot
            .accepted
            .iter()
            .map(|(key, age)| AcceptedImage {
                credential: key.to_hex(),
                age_ms: millis(*age),
            })
            .collect(),
        epoch: snapshot.epoch,
        tombstones: snapshot.tombstones.as_ref().map(|b| TombstonesImage {
            key: hex::encode(b.key),
            reuses_ids: b.reuses_ids,
            ranges: b
                .ranges
                .iter()
                .map(|&(first, last, left)| (first, last, millis(left)))
                .collect(),
            ids: b
                .ids
                .iter()
                .map(|&(digest, left)| (digest, millis(left)))
                .collect(),
        }),
    }
}

/// `d` in whole milliseconds.
fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The tombstones an image carries; `None` when its key is not 16 bytes in hex.
fn buried(image: &TombstonesImage) -> Option<Buried> {
    let mut key = [0; 16];
    hex::decode_to_slice(&image.key, &mut key).ok()?;
    let left = std::time::Duration::from_millis;
    Some(Buried {
        key,
        reuses_ids: image.reuses_ids,
        ranges: image
            .ranges
            .iter()
            .map(|&(first, last, ms)| (first, last, left(ms)))
            .collect(),
        ids: image
            .ids
            .iter()
            .map(|&(digest, ms)| (digest, left(ms)))
            .collect(),
    })
}

/// The image of a stream snapshot.
pub(crate) fn stream_image(snapshot: &StreamSnapshot) -> StreamImage {
    StreamImage {
        key: snapshot.key.clone(),
        kind: match snapshot.kind {
            StreamKind::Post => KindImage::Post,
            StreamKind::Batch => KindImage::Batch,
            StreamKind::Standalone => KindImage::Standalone,
        },
        pending: snapshot.pending.clone(),
        complete: snapshot.complete,
        stored: snapshot.stored.as_ref().map(reply_image),
        sse: snapshot.sse.as_ref().map(headers_to),
        last_seq: snapshot.last_seq,
        evicted_through: snapshot.evicted_through,
        events: snapshot
            .events
            .iter()
            .map(|ev| EventImage {
                seq: ev.seq,
                event: ev.event.clone(),
                data: String::from_utf8_lossy(&ev.data).into_owned(),
            })
            .collect(),
        withdrawn: snapshot.withdrawn,
    }
}

/// The images of retry records.
pub(crate) fn request_images(records: &[RetryRecord]) -> Vec<RequestImage> {
    records
        .iter()
        .map(|r| RequestImage {
            id: r.id.clone(),
            digest: hex::encode(r.digest),
            stream: r.stream.clone(),
        })
        .collect()
}

/// The session an image describes, handed over by pod `from`, whose id `key` minted (see
/// [`Session::from_parts`]).
///
/// # Errors
/// A message when the image names an unknown or stateless protocol version, has a stream
/// numbered beyond [`MAX_SEQ`], or a binding that is not one (an unbound copy would let anyone
/// with the id in).
pub(crate) fn restore_session(
    image: &SessionImage,
    key: Arc<Key>,
    from: &str,
    limits: BufferLimits,
    retained: &Retained,
) -> Result<Arc<Session>, String> {
    let version = ProtocolVersion::parse(&image.version)
        .filter(|v| !v.is_stateless())
        .ok_or_else(|| format!("unknown sessionful version {:?}", image.version))?;
    if let Some(stream) = image.streams.iter().find(|s| !numbered_within(s)) {
        return Err(format!(
            "stream {} is numbered beyond {MAX_SEQ}",
            stream.key
        ));
    }
    let binding = match &image.binding {
        None => None,
        Some(text) => {
            Some(Binding::from_image(text).ok_or_else(|| format!("malformed binding {text:?}"))?)
        }
    };
    let journal = &image.journal;
    let snapshot = SessionSnapshot {
        id: image.id.clone(),
        version,
        journal: Journal::from_parts(
            journal.initialize.clone(),
            journal.initialized,
            journal.log_level.clone(),
            journal.subscriptions.clone(),
        ),
        records: records(&image.requests),
        streams: image.streams.iter().map(stream_snapshot).collect(),
        standalone_unsupported: image.standalone_unsupported.as_ref().and_then(stored_reply),
        credentialed: image.credentialed,
        binding,
        // A digest that is not one is left out: that credential is asked about again.
        accepted: image
            .accepted
            .iter()
            .filter_map(|a| {
                let key = Principal::from_hex(&a.credential)?;
                Some((key, std::time::Duration::from_millis(a.age_ms)))
            })
            .collect(),
        epoch: image.epoch,
        tombstones: match &image.tombstones {
            None => None,
            Some(t) => Some(buried(t).ok_or("malformed tombstones key")?),
        },
    };
    Ok(Session::from_parts(snapshot, key, from, limits, retained))
}

/// Applies the streams and retry records of a tail message from pod `from` to `session`;
/// returns how many events were new (see [`Session::import`]). A stream numbered beyond
/// [`MAX_SEQ`] is left out.
pub(crate) fn import(
    session: &Session,
    streams: &[StreamImage],
    requests: &[RequestImage],
    from: &str,
    limits: BufferLimits,
) -> usize {
    let streams: Vec<StreamSnapshot> = streams
        .iter()
        .filter(|s| numbered_within(s))
        .map(stream_snapshot)
        .collect();
    session.import(&streams, &records(requests), from, limits)
}

/// The stream snapshot an image describes.
fn stream_snapshot(image: &StreamImage) -> StreamSnapshot {
    StreamSnapshot {
        key: image.key.clone(),
        kind: match image.kind {
            KindImage::Post => StreamKind::Post,
            KindImage::Batch => StreamKind::Batch,
            KindImage::Standalone => StreamKind::Standalone,
        },
        pending: image.pending.clone(),
        complete: image.complete,
        stored: image.stored.as_ref().and_then(stored_reply),
        sse: image.sse.as_deref().map(headers_from),
        last_seq: image.last_seq,
        evicted_through: image.evicted_through,
        events: image
            .events
            .iter()
            .map(|ev| SnapshotEvent {
                seq: ev.seq,
                // A name with a line end is no SSE event type (it would end the `event:` line
                // and start another field in the client's stream).
                event: ev.event.clone().filter(|e| !e.contains(['\r', '\n'])),
                data: Bytes::from(ev.data.clone()),
            })
            .collect(),
        withdrawn: image.withdrawn,
    }
}

/// Retry records from their images; one whose digest is not 32 bytes of hex is left out.
fn records(images: &[RequestImage]) -> Vec<RetryRecord> {
    images
        .iter()
        .filter_map(|r| {
            let mut digest = [0u8; 32];
            hex::decode_to_slice(&r.digest, &mut digest).ok()?;
            Some(RetryRecord {
                id: r.id.clone(),
                digest,
                stream: r.stream.clone(),
            })
        })
        .collect()
}

fn reply_image(reply: &StoredReply) -> ReplyImage {
    ReplyImage {
        status: reply.status.as_u16(),
        headers: headers_to(&reply.headers),
        body: String::from_utf8_lossy(&reply.body).into_owned(),
    }
}

/// The stored reply an image describes; `None` when its status is not a valid HTTP status.
fn stored_reply(image: &ReplyImage) -> Option<StoredReply> {
    Some(StoredReply {
        status: StatusCode::from_u16(image.status).ok()?,
        headers: headers_from(&image.headers),
        body: Bytes::from(image.body.clone()),
    })
}

/// Headers as `(name, value)` text pairs (values that are not visible ASCII are left out).
fn headers_to(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .filter_map(|(n, v)| Some((n.as_str().to_owned(), v.to_str().ok()?.to_owned())))
        .collect()
}

/// Headers from `(name, value)` text pairs (invalid pairs are left out).
fn headers_from(pairs: &[(String, String)]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (n, v) in pairs {
        if let (Ok(n), Ok(v)) = (HeaderName::try_from(n.as_str()), HeaderValue::try_from(v)) {
            headers.append(n, v);
        }
    }
    headers
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::session::fixtures::{ANY_ROOM, key, limits, session, stream};
    use crate::session::{Dedupe, RetryRoom};

    /// The session `image` describes, restored on a pod without budgets.
    fn restore_unbounded(image: &SessionImage) -> Result<Arc<Session>, String> {
        restore_session(
            image,
            crate::keys::test_key(),
            "pod-a",
            limits(),
            &Retained::new(u64::MAX),
        )
    }

    #[test]
    fn an_imaged_session_is_restored_with_its_streams_and_retry_records() {
        let s = session();
        let ids = [key(1)];
        let st = stream(&s, &ids);
        s.claim(&ids, [7; 32], &st, ANY_ROOM);
        st.append(None, bytes::Bytes::from_static(b"{}"), Instant::now());
        let (snapshot, positions) = s.snapshot(1 << 20);
        let image = session_image(&snapshot);
        assert_eq!(positions.get(st.key()), Some(&1));
        let copy = restore_unbounded(&image).unwrap();
        assert!(copy.needs_rebuild());
        assert_eq!(copy.version(), s.version());
        assert_eq!(copy.journal(), s.journal());
        // A retried POST at the new holder attaches to the copied stream: no second dispatch.
        let retry = stream(&copy, &ids);
        match copy.claim(&ids, [7; 32], &retry, ANY_ROOM) {
            Dedupe::Retry(found) => {
                assert_eq!(found.key(), st.key());
                assert_eq!(found.following().as_deref(), Some("pod-a"));
            }
            v => panic!("expected a retry, got {v:?}"),
        }
        assert!(matches!(
            copy.claim(&ids, [8; 32], &retry, ANY_ROOM),
            Dedupe::Conflict
        ));
        let mut bad = image.clone();
        bad.version = "2026-07-28".into();
        assert!(
            restore_unbounded(&bad).is_err(),
            "a stateless version has no session"
        );
    }

    #[tokio::test]
    async fn requests_answered_and_forgotten_stay_forgotten_where_the_session_goes() {
        let s = session();
        let room = RetryRoom {
            window: crate::session::RetryWindow {
                requests: 2,
                ..ANY_ROOM.window
            },
            ..ANY_ROOM
        };
        let reply = crate::stream::StoredReply {
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            body: Bytes::from_static(b"{}"),
        };
        let number = |i: i64| key(i);
        let text =
            |i: i64| crate::mcp::jsonrpc::RequestKey::of(&serde_json::json!(format!("t{i}")));
        for i in 1..=12 {
            for id in [number(i), text(i)] {
                let st = stream(&s, std::slice::from_ref(&id));
                assert!(matches!(s.claim(&[id], [7; 32], &st, room), Dedupe::New));
                st.store_reply(reply.clone());
                let _ = st.wait_head().await;
            }
        }
        let mut image = session_image(&s.snapshot(1 << 20).0);
        let tombstones = image.tombstones.as_mut().expect("tombstones");
        assert!(!tombstones.ranges.is_empty() && !tombstones.ids.is_empty());
        // 5 s left, as the sender counted it.
        tombstones.ranges.iter_mut().for_each(|r| r.2 = 5_000);
        let carried = tombstones.clone();
        let text_image = serde_json::to_vec(&image).unwrap();
        let copy = restore_unbounded(&serde_json::from_slice(&text_image).unwrap()).unwrap();
        for id in [number(1), text(1)] {
            let retry = stream(&copy, std::slice::from_ref(&id));
            assert!(
                matches!(
                    copy.claim(std::slice::from_ref(&id), [7; 32], &retry, room),
                    Dedupe::Expired(_)
                ),
                "a retry of {id:?}, forgotten before the session moved, is not run again"
            );
        }
        let new = stream(&copy, &[key(99)]);
        assert!(matches!(
            copy.claim(&[key(99)], [7; 32], &new, room),
            Dedupe::New
        ));
        // They keep the time they had left, and a malformed key refuses the image.
        let again = session_image(&copy.snapshot(0).0).tombstones.unwrap();
        assert!(
            again.ranges.iter().all(|&(_, _, ms)| ms > 0 && ms <= 5_000),
            "{again:?}"
        );
        assert_eq!(again.key, carried.key, "the digests' key moved with them");
        let mut bad = image.clone();
        bad.tombstones.as_mut().unwrap().key = "zz".into();
        assert!(restore_unbounded(&bad).is_err());
        // The fuzz target's property (fuzz/seeds/handoff/tombstones): an adopted session's
        // image adopts to the same image, the times left aside.
        let seed = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fuzz/seeds/handoff/tombstones"
        ))
        .unwrap();
        let push: crate::peer::wire::SessionPush = serde_json::from_slice(&seed).unwrap();
        let reimage = |image: &SessionImage| {
            let copy = restore_unbounded(image).unwrap();
            let mut again = session_image(&copy.snapshot(usize::MAX).0);
            if let Some(t) = &mut again.tombstones {
                t.ranges.iter_mut().for_each(|r| r.2 = 60_000);
                t.ids.iter_mut().for_each(|i| i.1 = 60_000);
                t.ids.sort_unstable();
            }
            again
        };
        let once = reimage(&push.session);
        let twice = reimage(&once);
        assert_eq!(once.tombstones, twice.tombstones);
        assert_eq!(once.tombstones.as_ref().unwrap().ids.len(), 3);
        let ranges = &once.tombstones.as_ref().unwrap().ranges;
        assert_eq!(
            ranges,
            &[(1, 5, 60_000), (9, 9, 60_000)],
            "the overlapping range is left out"
        );
    }

    #[test]
    fn accepted_credentials_move_with_their_age_and_only_valid_digests() {
        let s = session();
        let (alice, bob) = (Principal([1; 16]), Principal([2; 16]));
        s.accept_credential(alice);
        let mut image = session_image(&s.snapshot(0).0);
        assert_eq!(image.accepted.len(), 1);
        assert_eq!(image.accepted[0].credential, alice.to_hex());
        image.accepted[0].age_ms = 30_000;
        image.accepted.push(AcceptedImage {
            credential: "not hex".into(),
            age_ms: 0,
        });
        image.accepted.push(AcceptedImage {
            credential: bob.to_hex(),
            age_ms: u64::MAX,
        });
        let copy = restore_unbounded(&image).unwrap();
        let window = std::time::Duration::from_secs(60);
        assert!(copy.credential_accepted(alice, window), "accepted 30 s ago");
        assert!(
            !copy.credential_accepted(alice, window / 3),
            "the age moved with it: not within 20 s"
        );
        assert!(
            !copy.credential_accepted(bob, window),
            "an age beyond this pod's clock is left out"
        );
        assert_eq!(
            session_image(&copy.snapshot(0).0).accepted.len(),
            1,
            "the malformed digest and the impossible age were left out"
        );
        // A peer's list longer than a session keeps: the newest are kept.
        image.accepted = (0..20u8)
            .map(|i| AcceptedImage {
                credential: Principal([i; 16]).to_hex(),
                age_ms: u64::from(20 - i) * 1000,
            })
            .collect();
        let copy = restore_unbounded(&image).unwrap();
        let kept = session_image(&copy.snapshot(0).0).accepted;
        assert_eq!(kept.len(), 8);
        assert_eq!(kept[7].credential, Principal([19; 16]).to_hex());
    }

    #[test]
    fn streams_numbered_beyond_max_seq_are_refused() {
        let s = session();
        let ids = [key(1)];
        let st = stream(&s, &ids);
        s.claim(&ids, [7; 32], &st, ANY_ROOM);
        st.append(None, bytes::Bytes::from_static(b"{}"), Instant::now());
        let (snapshot, _) = s.snapshot(1 << 20);
        let image = session_image(&snapshot);
        let retained = Retained::new(u64::MAX);
        let restore = |image: &SessionImage| {
            restore_session(image, crate::keys::test_key(), "pod-a", limits(), &retained)
                .map(|_| ())
        };
        assert_eq!(restore(&image), Ok(()));
        for (last_seq, evicted_through, seq) in [
            (u64::MAX, 0, 1),
            (MAX_SEQ + 1, 0, 1),
            (3, u64::MAX, 1),
            (3, 0, MAX_SEQ + 1),
        ] {
            let mut bad = image.clone();
            bad.streams[0].last_seq = last_seq;
            bad.streams[0].evicted_through = evicted_through;
            bad.streams[0].events[0].seq = seq;
            assert!(restore(&bad).is_err(), "{last_seq} {evicted_through} {seq}");
            // In a tail, such a stream is left out; the session keeps what it had.
            let copy = restore_session(
                &image,
                crate::keys::test_key(),
                "pod-a",
                limits(),
                &retained,
            )
            .unwrap();
            assert_eq!(import(&copy, &bad.streams, &[], "pod-a", limits()), 0);
            assert_eq!(copy.streams()[0].last_seq(), 1);
        }
        let mut edge = image.clone();
        edge.streams[0].last_seq = MAX_SEQ;
        assert_eq!(restore(&edge), Ok(()));
    }

    #[test]
    fn event_names_with_line_ends_are_left_out() {
        let s = session();
        let ids = [key(1)];
        let st = stream(&s, &ids);
        s.claim(&ids, [7; 32], &st, ANY_ROOM);
        for _ in 0..4 {
            st.append(
                Some("progress".into()),
                bytes::Bytes::from_static(b"{}"),
                Instant::now(),
            );
        }
        let (snapshot, _) = s.snapshot(1 << 20);
        let mut image = session_image(&snapshot);
        for (ev, name) in image.streams[0]
            .events
            .iter_mut()
            .zip(["a\nb", "a\rdata: x", "a\r\nb"])
        {
            ev.event = Some(name.into());
        }
        let retained = Retained::new(u64::MAX);
        let copy = restore_session(
            &image,
            crate::keys::test_key(),
            "pod-a",
            limits(),
            &retained,
        )
        .unwrap();
        let (restored, _) = copy.streams()[0].snapshot(0, usize::MAX);
        let names: Vec<Option<&str>> = restored.events.iter().map(|e| e.event.as_deref()).collect();
        assert_eq!(names, [None, None, None, Some("progress")]);
    }
}
