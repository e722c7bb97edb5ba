//! Publishing the operator's Events (`events.k8s.io/v1`) through kube-runtime's `Recorder`, with
//! two corrections a cluster needs:
//!
//! - the API server refuses (422) an Event whose `note` is over [`NOTE_LIMIT`] bytes, so a long
//!   note is cut at a character boundary and ends with `…` (the condition's message keeps the
//!   whole text);
//! - a `Recorder` takes an Event with the type, action, reason, reporter and object of one it
//!   published in the last 6 minutes for a repeat, whatever its note, and only counts it in the
//!   first Event's `series`: a second `Degraded` or `Applied` with another message would not
//!   show. [`Events`] keeps one `Recorder` per object, type, reason and note, so the same note
//!   again counts in the series and a different note is a new Event.
//!
//! The recorders are bounded: at most [`CAPACITY`], each dropped [`WINDOW`] after its last use
//! (the `Recorder`'s own window), the least recently used first when the map is full.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// The most bytes of an Event's `note` the API server accepts (`events.k8s.io/v1`).
pub const NOTE_LIMIT: usize = 1024;
/// What ends a note cut to [`NOTE_LIMIT`].
const ELLIPSIS: &str = "…";
/// How long after its last Event a recorder is kept: kube-runtime's de-duplication window.
const WINDOW: Duration = Duration::from_secs(6 * 60);
/// The most recorders kept at once.
const CAPACITY: usize = 256;
/// The `action` of every Event the operator publishes.
const ACTION: &str = "Reconcile";

/// Publishes the operator's Events; shared by every reconcile.
pub struct Events {
    client: Client,
    reporter: Reporter,
    recorders: Mutex<Recent<Key, Recorder>>,
}

/// What tells two Events apart: the object (namespace, name, UID), the type, the reason and the
/// note as sent.
type Key = ([Option<String>; 3], EventType, String, String);

impl Events {
    /// Publishes through `client`, naming `reporter` as the Events' source.
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter,
            recorders: Mutex::new(Recent::default()),
        }
    }

    /// Publishes an Event about `regarding` with `reason` (PascalCase) and `note`, cut to
    /// [`NOTE_LIMIT`] bytes. Within 6 minutes of an Event with the same object, type, reason and
    /// note it counts in that Event's series instead.
    ///
    /// # Errors
    /// The API server's answer to the create or the series patch.
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        note: &str,
    ) -> Result<(), kube::Error> {
        let note = truncate(note);
        let object = [&regarding.namespace, &regarding.name, &regarding.uid].map(Clone::clone);
        let key = (object, type_, reason.to_owned(), note.clone());
        let recorder = self
            .recorders
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert_with(key, Instant::now(), || {
                Recorder::new(self.client.clone(), self.reporter.clone())
            });
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: ACTION.to_owned(),
            secondary: None,
        };
        recorder.publish(&event, regarding).await
    }
}

/// `note`, or when it is over [`NOTE_LIMIT`] bytes its longest prefix that ends on a character
/// boundary and leaves room for [`ELLIPSIS`], followed by it.
fn truncate(note: &str) -> String {
    if note.len() <= NOTE_LIMIT {
        return note.to_owned();
    }
    let cut = (0..=NOTE_LIMIT - ELLIPSIS.len())
        .rev()
        .find(|&i| note.is_char_boundary(i))
        .unwrap_or(0);
    format!("{}{ELLIPSIS}", &note[..cut])
}

/// Values by key, each kept until [`WINDOW`] after its last use and at most [`CAPACITY`] of
/// them: when full, the least recently used goes first.
struct Recent<K, V> {
    entries: HashMap<K, (V, Instant)>,
}

impl<K, V> Default for Recent<K, V> {
    fn default() -> Self {
        Self {
            entries: HashMap::new(),
        }
    }
}

impl<K: Hash + Eq + Clone, V: Clone> Recent<K, V> {
    /// The value of `key`, made by `new` when there is none; either way used at `now`.
    fn get_or_insert_with(&mut self, key: K, now: Instant, new: impl FnOnce() -> V) -> V {
        self.entries
            .retain(|_, (_, used)| now.saturating_duration_since(*used) < WINDOW);
        if self.entries.len() >= CAPACITY && !self.entries.contains_key(&key) {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                self.entries.remove(&oldest);
            }
        }
        let (value, used) = self.entries.entry(key).or_insert_with(|| (new(), now));
        *used = now;
        value.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_within_the_limit_is_kept_whole() {
        assert_eq!(truncate("applied ConfigMap/a"), "applied ConfigMap/a");
        let exactly = "x".repeat(NOTE_LIMIT);
        assert_eq!(truncate(&exactly), exactly);
    }

    #[test]
    fn a_longer_note_is_cut_to_the_limit_and_ends_with_an_ellipsis() {
        let note = "y".repeat(NOTE_LIMIT + 1);
        let cut = truncate(&note);
        assert_eq!(cut.len(), NOTE_LIMIT);
        assert_eq!(cut, format!("{}…", &note[..NOTE_LIMIT - 3]));
    }

    #[test]
    fn the_cut_backs_off_to_a_character_boundary() {
        // 2 bytes, then 3-byte characters: byte 1021 (the room left for `…`) falls inside one.
        let note = format!("ab{}", "€".repeat(400));
        let cut = truncate(&note);
        // 2 + 339 × 3 = 1019 bytes fit; the 340th `€` would end at 1022.
        assert_eq!(cut, format!("ab{}…", "€".repeat(339)));
        assert_eq!(cut.len(), 1022);
        // A 4-byte character right across the limit.
        let note = format!("{}{}", "z".repeat(NOTE_LIMIT - 5), "😀".repeat(3));
        let cut = truncate(&note);
        assert_eq!(cut, format!("{}…", "z".repeat(NOTE_LIMIT - 5)));
        assert!(cut.len() <= NOTE_LIMIT);
    }

    /// `get_or_insert_with` of `key` at `t0 + ms` milliseconds, counting in `made` the values
    /// made.
    fn use_at(recent: &mut Recent<u32, u32>, key: u32, t0: Instant, ms: u64, made: &mut u32) {
        let at = t0 + Duration::from_millis(ms);
        recent.get_or_insert_with(key, at, || {
            *made += 1;
            *made
        });
    }

    #[test]
    fn a_value_lives_until_the_window_after_its_last_use() {
        let (t0, mut recent, mut made) = (Instant::now(), Recent::default(), 0);
        let window = u64::try_from(WINDOW.as_millis()).unwrap();
        use_at(&mut recent, 1, t0, 0, &mut made);
        // Each use within the window keeps the value and moves the window's end.
        use_at(&mut recent, 1, t0, window - 1, &mut made);
        use_at(&mut recent, 1, t0, 2 * window - 2, &mut made);
        assert_eq!(made, 1);
        // A whole window after the last use it is gone: a new one is made.
        use_at(&mut recent, 1, t0, 3 * window - 2, &mut made);
        assert_eq!(made, 2);
        // Another key has its own value, and the expired ones are dropped on the way.
        use_at(&mut recent, 2, t0, 5 * window, &mut made);
        assert_eq!((made, recent.entries.len()), (3, 1));
    }

    #[test]
    fn a_full_map_drops_the_least_recently_used() {
        let (t0, mut recent, mut made) = (Instant::now(), Recent::default(), 0);
        for key in 0..CAPACITY as u32 {
            use_at(&mut recent, key, t0, u64::from(key), &mut made);
        }
        // Key 0 is used again, so key 1 is now the least recently used.
        use_at(&mut recent, 0, t0, 1000, &mut made);
        use_at(&mut recent, 9999, t0, 1001, &mut made);
        assert_eq!(made, CAPACITY as u32 + 1, "key 0 was kept");
        assert_eq!(recent.entries.len(), CAPACITY);
        assert!(recent.entries.contains_key(&0));
        assert!(!recent.entries.contains_key(&1));
    }
}
