//! A session's standalone GET stream, read by its own task for the whole session.
//!
//! The client registers each `notify` call's text and count before making it
//! ([`Standalone::expect`]); the reader attributes every log notification to a registered text
//! and sequence number, so a notification received twice (or an event id seen twice) is
//! *duplicated*, one of another text is *foreign*, one never received is *lost*. When the stream
//! ends (the pod stopped, or it closed the stream to move the session) or the client cuts it
//! ([`Standalone::cut`]), the reader resumes with `GET` + `Last-Event-ID`, as EventSource does.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::Value;
use sse_stream::Sse;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use super::clients::Figures;
use crate::Result;
use crate::client::{Events, McpClient, Session, error_reason, is_sse, unexpected};
use crate::follow::{self, Resumed};
use crate::incident::{Incident, IncidentKind};

/// Attempts to resume the stream before the reader gives up.
const RESUME_ATTEMPTS: u32 = 5;
/// Pause between two attempts.
const RESUME_PAUSE: Duration = Duration::from_millis(100);

/// What the reader heard.
#[derive(Debug, Default)]
struct Heard {
    /// Notification count per registered `notify` text.
    expected: HashMap<String, u32>,
    /// Sequence numbers received per text.
    received: HashMap<String, HashSet<u64>>,
    /// Event ids seen.
    ids: HashSet<String>,
    /// The keys of the streams read, in order (a resume may go on with another stream).
    streams: Vec<String>,
    /// The id of the last event read.
    last_id: Option<String>,
    /// The pod each GET that carried the stream came from, in order.
    pods: Vec<String>,
    /// The `data.reason` of the JSON-RPC error that ended the stream (an error message on it,
    /// or the refusal of a resume), when one did: what did not arrive is lost but announced.
    announced: Option<String>,
    figures: Figures,
}

impl Heard {
    /// Attributes one event; [`Heard::last_id`] follows the stream's cursor.
    fn record(&mut self, ev: Sse) {
        let data = ev.data.unwrap_or_default();
        let mut duplicated = false;
        if let Some(id) = ev.id {
            duplicated = !data.is_empty() && !self.ids.insert(id.clone());
            let key = id.rsplit_once('-').map_or(id.as_str(), |(key, _)| key);
            if self.streams.last().is_none_or(|last| last != key) {
                self.streams.push(key.to_owned());
            }
            self.last_id = Some(id);
        }
        if data.is_empty() {
            return; // priming event
        }
        let report = &mut self.figures.report;
        report.events += 1;
        let event = self.last_id.as_deref().unwrap_or("without an id");
        let pod = self.pods.last().map_or("no pod", String::as_str);
        match notification(&data) {
            Some((text, seq)) if self.expected.contains_key(&text) => {
                duplicated |= !self.received.entry(text).or_default().insert(seq);
            }
            None if error_reason(&data).is_some() => {
                let reason = error_reason(&data).unwrap_or_default();
                self.announced.get_or_insert_with(|| reason.to_owned());
            }
            _ => {
                report.foreign += 1;
                let shown: String = data.chars().take(240).collect();
                let detail =
                    format!("standalone stream: event {event} from {pod} is foreign: {shown}");
                report
                    .incidents
                    .push(Incident::new(IncidentKind::Foreign, detail));
            }
        }
        if duplicated {
            report.duplicated += 1;
            let detail = format!("standalone stream: event {event} from {pod} arrived twice");
            report
                .incidents
                .push(Incident::new(IncidentKind::Duplicated, detail));
        }
    }

    /// Records a failed resume; the reason of a JSON-RPC error in it (if any) announces the
    /// stream's end.
    fn resume_failed(&mut self, failure: String) {
        if let Some(reason) = error_reason(&failure) {
            self.announced.get_or_insert_with(|| reason.to_owned());
        }
        self.figures.report.failures.push(failure);
    }

    /// Registered notifications not received: each text with its missing sequence numbers,
    /// sorted.
    fn missing_by_text(&self) -> Vec<(String, Vec<u64>)> {
        let mut missing: Vec<(String, Vec<u64>)> = self
            .expected
            .iter()
            .filter_map(|(text, &count)| {
                let got = self.received.get(text);
                let seqs: Vec<u64> = (1..=u64::from(count))
                    .filter(|seq| !got.is_some_and(|g| g.contains(seq)))
                    .collect();
                (!seqs.is_empty()).then(|| (text.clone(), seqs))
            })
            .collect();
        missing.sort();
        missing
    }

    /// Registered notifications not received, for a report: each text with its missing
    /// sequence numbers, the streams read and the last event id.
    fn describe_missing(&self) -> String {
        format!(
            "standalone stream: notifications never arrived: {:?}; streams read {:?} \
             from {}, last event {}",
            self.missing_by_text(),
            self.streams,
            self.pods.join(", then "),
            self.last_id.as_deref().unwrap_or("none")
        )
    }

    /// Registered notifications not received.
    fn missing(&self) -> u64 {
        self.missing_by_text()
            .iter()
            .map(|(_, seqs)| seqs.len() as u64)
            .sum()
    }
}

/// The text and sequence number of a `notify` log notification.
fn notification(data: &str) -> Option<(String, u64)> {
    let msg: Value = serde_json::from_str(data).ok()?;
    if msg.get("method")?.as_str()? != "notifications/message" {
        return None;
    }
    let payload = msg.pointer("/params/data")?;
    Some((
        payload.get("text")?.as_str()?.to_owned(),
        payload.get("seq")?.as_u64()?,
    ))
}

/// An open standalone GET stream and its reader task.
pub(super) struct Standalone {
    heard: Arc<Mutex<Heard>>,
    cut: Arc<Notify>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Standalone {
    /// Opens the session's GET stream and starts reading it; a cut is resumed after a random
    /// pause of at most `max_pause`.
    ///
    /// # Errors
    /// [`crate::HarnessError`] when the GET fails or is not answered with an SSE stream.
    pub async fn open(client: &McpClient, session: &Session, max_pause: Duration) -> Result<Self> {
        let resp = client.get(session, None).await?;
        if resp.status() != StatusCode::OK || !is_sse(&resp) {
            return Err(unexpected("standalone GET", resp).await);
        }
        let heard = Arc::new(Mutex::new(Heard::default()));
        let events = Events::new(resp);
        lock(&heard).pods.push(events.pod().to_owned());
        let cut = Arc::new(Notify::new());
        let (stop, stopped) = watch::channel(false);
        let reader = Reader {
            client: client.clone(),
            session: session.clone(),
            heard: Arc::clone(&heard),
            cut: Arc::clone(&cut),
            stopped,
            max_pause,
        };
        let task = tokio::spawn(reader.run(events));
        Ok(Self {
            heard,
            cut,
            stop,
            task,
        })
    }

    /// Registers a `notify` call's text and count, before the call.
    pub fn expect(&self, text: &str, count: u32) {
        lock(&self.heard).expected.insert(text.to_owned(), count);
    }

    /// Forgets a registered text: its `notify` call failed, nothing is expected.
    pub fn forget(&self, text: &str) {
        lock(&self.heard).expected.remove(text);
    }

    /// Cuts the connection; the reader resumes it.
    pub fn cut(&self) {
        self.cut.notify_one();
    }

    /// Waits (at most `within`) for every registered notification, stops the reader and
    /// returns its figures, registered notifications not received counted lost.
    pub async fn finish(self, within: Duration) -> Figures {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline
            && !self.task.is_finished()
            && lock(&self.heard).missing() > 0
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = self.stop.send(true);
        let _ = self.task.await;
        let mut heard = std::mem::take(&mut *lock(&self.heard));
        let missing = heard.missing();
        let detail = heard.describe_missing();
        let report = &mut heard.figures.report;
        match heard.announced.take() {
            Some(reason) => {
                *report.announced.entry(reason).or_default() += 1;
                report.announced_lost += missing;
            }
            None if missing > 0 => report
                .incidents
                .push(Incident::new(IncidentKind::Lost, detail)),
            None => {}
        }
        report.lost += missing;
        heard.figures
    }
}

fn lock(heard: &Mutex<Heard>) -> std::sync::MutexGuard<'_, Heard> {
    heard.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The reader task.
struct Reader {
    client: McpClient,
    session: Session,
    heard: Arc<Mutex<Heard>>,
    cut: Arc<Notify>,
    stopped: watch::Receiver<bool>,
    max_pause: Duration,
}

impl Reader {
    async fn run(mut self, mut events: Events) {
        loop {
            let cut = tokio::select! {
                ev = events.next() => match ev {
                    Some(ev) => {
                        lock(&self.heard).record(ev);
                        continue;
                    }
                    None => false,
                },
                // Without a cursor a new GET could not resume: a client cuts only after an event.
                () = self.cut.notified(), if lock(&self.heard).last_id.is_some() => true,
                _ = self.stopped.changed() => return,
            };
            drop(events);
            if cut {
                let pause = rand::random_range(0..=self.max_pause.as_millis() as u64);
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
            let cursor = lock(&self.heard).last_id.clone();
            match self.resume(cursor.as_deref()).await {
                Some(resumed) => events = resumed,
                None => return,
            }
        }
    }

    /// Opens the stream again, after `cursor` when there is one; `None` when the session is
    /// gone (404), the reader is stopped, or every attempt failed.
    async fn resume(&mut self, cursor: Option<&str>) -> Option<Events> {
        for _ in 0..RESUME_ATTEMPTS {
            if *self.stopped.borrow() {
                return None;
            }
            let started = Instant::now();
            let (client, session) = (&self.client, &self.session);
            let failure =
                match follow::reconnect(client, session, cursor, &[], &mut Vec::new()).await {
                    Ok(Resumed::Stream(events)) => {
                        let mut heard = lock(&self.heard);
                        heard.pods.push(events.pod().to_owned());
                        if cursor.is_some() {
                            let report = &mut heard.figures.report;
                            report.resumes += 1;
                            report.resume_latencies.push(started.elapsed());
                        }
                        return Some(events);
                    }
                    Ok(Resumed::Gone) => {
                        let figures = &mut lock(&self.heard).figures;
                        figures.report.not_found += 1;
                        figures.saw_not_found_at(Some(Instant::now()));
                        return None;
                    }
                    Err(e) => format!("standalone GET: {e}"),
                };
            lock(&self.heard).resume_failed(failure);
            tokio::time::sleep(RESUME_PAUSE).await;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: &str, data: &str) -> Sse {
        Sse::default().id(id).data(data)
    }

    fn note(text: &str, seq: u64) -> String {
        serde_json::json!({"jsonrpc": "2.0", "method": "notifications/message",
            "params": {"level": "info", "data": {"text": text, "seq": seq}}})
        .to_string()
    }

    #[test]
    fn what_went_wrong_names_the_events_streams_and_pods() {
        let mut heard = Heard::default();
        heard.expected.insert("n0".into(), 3);
        heard.pods.push("pod 127.0.0.2".into());
        heard.record(event("k1-1", &note("n0", 1)));
        heard.record(event("k1-1", &note("n0", 1)));
        heard.pods.push("pod 127.0.0.3".into());
        heard.record(event("k2-1", &note("n9", 1)));
        let report = &heard.figures.report;
        assert_eq!((report.duplicated, report.foreign), (1, 1));
        let details: Vec<&str> = report.incidents.iter().map(|i| i.detail.as_str()).collect();
        assert!(
            details[0].contains("event k1-1 from pod 127.0.0.2 arrived twice"),
            "{details:?}"
        );
        assert!(
            details[1].contains("event k2-1 from pod 127.0.0.3 is foreign"),
            "{details:?}"
        );
        assert_eq!(heard.missing(), 2);
        let missing = heard.describe_missing();
        assert!(
            missing.contains(r#"[("n0", [2, 3])]"#)
                && missing.contains(
                    r#"streams read ["k1", "k2"] from pod 127.0.0.2, then pod 127.0.0.3"#
                )
                && missing.contains("last event k2-1"),
            "{missing}"
        );
    }
}
