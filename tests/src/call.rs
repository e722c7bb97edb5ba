//! One `slow` tool call as a client experiences it, checked event by event.
//!
//! The call's progress token is its `call_id`, so every message can be attributed: a progress
//! notification with another token, or a response with another id, is *foreign*; a progress
//! value or result received twice, or an event id seen twice, is *duplicated*; a progress value
//! or the result never received is *lost*; an event whose id names another stream is foreign
//! too.
//!
//! A [`Tracked`] call attributes the events of every connection that reads its stream (the
//! first response and each resume) into one [`CallOutcome`]: the tests that drive the
//! connections themselves (the fault-injection scenarios) cut, resume and reconnect it step by
//! step, and [`Tracked::follow`] follows its stream to the answer like EventSource
//! ([`crate::follow`]). [`slow`] runs a whole call on a [`CallPlan`]: the client cuts its
//! connection after the planned numbers of messages and resumes with `GET` + `Last-Event-ID`,
//! as the spec tells clients to; a stream that ends before the result is resumed
//! the same way. A resume answered 404 ends the call: the session is gone (S-05), the rest of
//! its events are lost.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::{Value, json};
use sse_stream::Sse;

use crate::client::{
    Events, McpClient, Session, body_text, error_reason, is_sse, result_text, tool_call, unexpected,
};
use crate::follow::{self, Follow, Refusal, Resumed};
use crate::{HarnessError, Result};

/// Longest silence on a stream before the call is declared stuck.
pub const STALL: Duration = Duration::from_secs(20);

/// How to run the call.
#[derive(Clone, Debug)]
pub struct CallPlan {
    /// Progress notifications the tool sends.
    pub count: u32,
    /// Milliseconds between them.
    pub interval_ms: u64,
    /// Cut the connection after receiving this many messages (ascending).
    pub cuts: Vec<u32>,
    /// Pause between a cut and the resume.
    pub pause: Duration,
    /// Ask the server to close the connection after this progress (SEP-1699).
    pub close_after: Option<u32>,
}

impl CallPlan {
    /// A plan of `count` progress notifications `interval_ms` apart, read without a cut.
    pub fn steady(count: u32, interval_ms: u64) -> Self {
        Self {
            count,
            interval_ms,
            cuts: Vec::new(),
            pause: Duration::ZERO,
            close_after: None,
        }
    }

    /// A plan of `count` progress notifications `interval_ms` apart that, with probability
    /// `cut_probability`, cuts the connection once or twice at random points and resumes after
    /// a random pause of at most `max_pause_ms`.
    pub fn random(count: u32, interval_ms: u64, cut_probability: f64, max_pause_ms: u64) -> Self {
        let mut cuts = Vec::new();
        if count > 1 && rand::random_bool(cut_probability.clamp(0.0, 1.0)) {
            let times = rand::random_range(1..=2u32);
            for _ in 0..times {
                cuts.push(rand::random_range(1..count));
            }
            cuts.sort_unstable();
            cuts.dedup();
        }
        Self {
            cuts,
            pause: Duration::from_millis(rand::random_range(0..=max_pause_ms)),
            ..Self::steady(count, interval_ms)
        }
    }

    /// The body of this plan's `slow` call: request `request_id`, with `call_id` as its call id
    /// and progress token.
    pub fn body(&self, request_id: u64, call_id: &str) -> Value {
        let mut body = slow_body(request_id, call_id, self.count, self.interval_ms);
        if let Some(k) = self.close_after {
            body["params"]["arguments"]["close_after"] = json!(k);
        }
        body
    }
}

/// What the client experienced.
#[derive(Clone, Debug, Default)]
pub struct CallOutcome {
    /// Progress values, in arrival order.
    pub progress: Vec<u32>,
    /// The result text (`done <count>`).
    pub result: Option<String>,
    /// Message events received (priming events excluded).
    pub events: u64,
    /// Messages or event ids received twice.
    pub duplicated: u64,
    /// Messages that belong to another request or stream.
    pub foreign: u64,
    /// Time from each resume request to its response headers.
    pub resumes: Vec<Duration>,
    /// Resumes answered 404: the session is gone, the call ends there (spec S-05).
    pub not_found: u64,
    /// What went wrong, if anything.
    pub failures: Vec<String>,
    /// The key of the stream read (from the first event id, `<key>-<seq>`).
    pub stream: Option<String>,
    /// Sequence numbers of the message events read, in arrival order.
    pub seqs: Vec<u64>,
    /// The pod each response that carried the call's stream came from, in order (the POST's,
    /// then each resume's).
    pub pods: Vec<String>,
    /// The `data.reason` of the JSON-RPC error that ended the call, when one did (its answer,
    /// or the refusal of a resume): the sidecar said the call was interrupted, so what did not
    /// arrive is lost but announced.
    pub announced: Option<String>,
    /// Times the request was sent again because its stream ended before any event id to
    /// resume from.
    pub resent: u64,
}

impl CallOutcome {
    /// What was read, for a report: the stream key and the sequence numbers of its events.
    pub fn read(&self) -> String {
        let from = self.pods.join(", then ");
        match &self.stream {
            Some(key) => format!("stream {key}, events {:?} read from {from}", self.seqs),
            None => format!("no event read (from {from})"),
        }
    }

    /// The pod the stream is read from now.
    fn pod(&self) -> &str {
        self.pods.last().map_or("no pod", String::as_str)
    }

    /// Expected messages never received: progress values 1..=count missing, plus the result.
    pub fn lost(&self, count: u32) -> u64 {
        let got: HashSet<u32> = self.progress.iter().copied().collect();
        let missing = (1..=count).filter(|p| !got.contains(p)).count() as u64;
        missing + u64::from(self.result.is_none())
    }
}

/// The body of a `slow` call: request `request_id`, `count` progress notifications
/// `interval_ms` apart, with `call_id` as its call id and progress token.
pub fn slow_body(request_id: u64, call_id: &str, count: u32, interval_ms: u64) -> Value {
    tool_call(
        request_id,
        "slow",
        json!({"count": count, "interval_ms": interval_ms, "call_id": call_id}),
        Some(call_id),
    )
}

/// Runs `slow` on `plan` as request `request_id` with `call_id` (also its progress token).
///
/// # Errors
/// [`HarnessError`] when the first POST fails outright; later problems are recorded in
/// [`CallOutcome::failures`].
pub async fn slow(
    client: &McpClient,
    session: &Session,
    request_id: u64,
    call_id: &str,
    plan: &CallPlan,
) -> Result<CallOutcome> {
    let (mut call, mut events) = Tracked::post(client, session, request_id, call_id, plan).await?;
    let how = Follow::default();
    for &cut in &plan.cuts {
        match call
            .follow(client, session, events, &how, Some(u64::from(cut)))
            .await
        {
            Stop::Reached(open) => drop(open),
            _ => return Ok(call.out),
        }
        tokio::time::sleep(plan.pause).await;
        if call.reader.last_id.is_none() {
            call.out
                .failures
                .push(format!("{call_id}: no event id to resume from"));
            return Ok(call.out);
        }
        match call.resume_now(client, session, &[]).await {
            Ok(resumed) => events = resumed,
            Err(_) => return Ok(call.out),
        }
    }
    call.follow(client, session, events, &how, None).await;
    Ok(call.out)
}

/// One `slow` call as its client sees it, over every connection that reads it.
#[derive(Clone, Debug)]
pub struct Tracked {
    reader: Reader,
    /// What arrived, and what went wrong.
    pub out: CallOutcome,
    /// Progress notifications the call sends.
    pub count: u32,
    /// Reconnects refused with `Retry-After` (only statuses a caller asked to retry).
    pub refused: Vec<Refusal>,
    /// Reconnects after the stream ended before the answer, over the call.
    reconnects: u32,
    /// The request, sent again when its stream ends before any event id to resume from.
    body: Option<Value>,
}

/// Where [`Tracked::follow`] stopped.
#[derive(Debug)]
pub enum Stop {
    /// The answer arrived.
    Answered,
    /// The call's messages reached the number asked for; the stream is still open.
    Reached(Events),
    /// A reconnect was answered 404: the session is gone (counted in [`CallOutcome::not_found`]).
    Gone,
    /// The stream kept ending without the answer ([`Follow::reconnects`] spent, or no event id
    /// to resume from), or a reconnect failed: recorded in [`CallOutcome::failures`].
    Failed,
}

impl Tracked {
    /// Request `id`, a `slow` call of `count` progress notifications with `call_id`, before any
    /// event was read.
    pub fn new(id: u64, call_id: &str, count: u32) -> Self {
        Self {
            reader: Reader::new(id, call_id),
            out: CallOutcome::default(),
            count,
            refused: Vec::new(),
            reconnects: 0,
            body: None,
        }
    }

    /// POSTs the `slow` call of `plan` as request `id` via `client`; returns the call and its
    /// stream.
    ///
    /// # Errors
    /// [`HarnessError`] when the POST fails or is not answered with 200 and an SSE stream.
    pub async fn post(
        client: &McpClient,
        session: &Session,
        id: u64,
        call_id: &str,
        plan: &CallPlan,
    ) -> Result<(Self, Events)> {
        let body = plan.body(id, call_id);
        let resp = client.post(Some(session), &body, &[]).await?;
        if resp.status() != StatusCode::OK {
            return Err(unexpected("tools/call slow", resp).await);
        }
        if !is_sse(&resp) {
            return Err(HarnessError::Protocol(format!(
                "slow answered without SSE: {}",
                body_text(resp).await?
            )));
        }
        let events = Events::new(resp);
        let mut call = Self::new(id, call_id, plan.count);
        call.body = Some(body);
        call.out.pods.push(events.pod().to_owned());
        Ok((call, events))
    }

    /// Takes one event; returns whether it carried a message (a priming event does not).
    pub fn take(&mut self, ev: Sse) -> bool {
        self.reader.take(ev, &mut self.out)
    }

    /// Reads `events` until `n` more messages arrived (10 s at most each).
    ///
    /// # Panics
    /// When the stream ends or stalls first.
    pub async fn take_messages(&mut self, events: &mut Events, n: usize) {
        let mut got = 0;
        while got < n {
            let ev = events
                .next_within(Duration::from_secs(10))
                .await
                .expect("the stream ended or stalled");
            got += usize::from(self.take(ev));
        }
    }

    /// Reads `events` to the answer, or to the end of this one stream (no reconnect).
    pub async fn finish(&mut self, mut events: Events) {
        while self.out.result.is_none() {
            match events.next_within(STALL).await {
                Some(ev) => {
                    self.take(ev);
                }
                None => return,
            }
        }
    }

    /// The key of the stream read (from the first event id).
    pub fn stream(&self) -> Option<&str> {
        self.out.stream.as_deref()
    }

    /// The cursor a client resumes from: the last event id it read.
    ///
    /// # Panics
    /// When no event with an id was read yet.
    pub fn cursor(&self) -> String {
        self.reader.last_id.clone().expect("an event id was read")
    }

    /// Reconnects after the last event read (GET + `Last-Event-ID`, spec R-03) via `client`,
    /// retrying a refusal whose status is in `retry_on` after its `Retry-After`
    /// ([`follow::reconnect`]); returns the stream, or `None` for the 404 of a lost session.
    ///
    /// # Errors
    /// What went wrong, when the answer is neither.
    pub async fn reconnect(
        &mut self,
        client: &McpClient,
        session: &Session,
        retry_on: &[StatusCode],
    ) -> Result<Option<Events>, String> {
        let cursor = self.cursor();
        let resumed =
            follow::reconnect(client, session, Some(&cursor), retry_on, &mut self.refused).await?;
        Ok(match resumed {
            Resumed::Stream(events) => {
                self.out.pods.push(events.pod().to_owned());
                Some(events)
            }
            Resumed::Gone => None,
        })
    }

    /// Resumes after the last event read, via `client`, and reads to the answer (on that one
    /// stream).
    ///
    /// # Errors
    /// When the resume is refused, or answered 404.
    pub async fn resume(&mut self, client: &McpClient, session: &Session) -> Result<(), String> {
        match self.reconnect(client, session, &[]).await? {
            Some(events) => {
                self.finish(events).await;
                Ok(())
            }
            None => Err(format!("resume after {} answered 404", self.cursor())),
        }
    }

    /// Every progress value and the answer arrived exactly once, nothing foreign.
    ///
    /// # Errors
    /// What the client received, when it is not that.
    pub fn whole(&self) -> Result<(), String> {
        let o = &self.out;
        let done = format!("done {}", self.count);
        if o.lost(self.count) == 0
            && o.duplicated == 0
            && o.foreign == 0
            && o.failures.is_empty()
            && o.result.as_deref() == Some(done.as_str())
        {
            Ok(())
        } else {
            Err(format!("call of {} progress: {o:?}", self.count))
        }
    }

    /// The progress values received after the first `n`.
    pub fn progress_after(&self, n: usize) -> &[u32] {
        self.out.progress.get(n..).unwrap_or_default()
    }

    /// Reads `events` and follows the stream like EventSource until the answer arrived (or,
    /// with `until`, the call's messages reached that number): when the stream ends or stalls
    /// for [`Follow::stall`] before, waits the last `retry` hint read ([`Follow::retry`]
    /// without one, spec R-07) and reconnects via `client` after the last event read, at most
    /// [`Follow::reconnects`] times over the call.
    pub async fn follow(
        &mut self,
        client: &McpClient,
        session: &Session,
        mut events: Events,
        how: &Follow,
        until: Option<u64>,
    ) -> Stop {
        while self.out.result.is_none() {
            if until.is_some_and(|n| self.out.events >= n) {
                return Stop::Reached(events);
            }
            if let Some(ev) = events.next_within(how.stall).await {
                self.take(ev);
                continue;
            }
            // The stream ended (or stalled) before the answer: resume like EventSource would;
            // a stream that ended before its first event id (its connection lost at once)
            // leaves nothing to resume from: the request is sent again instead (tether's retry
            // contract: never a second dispatch).
            drop(events);
            self.reconnects += 1;
            let no_cursor = self.reader.last_id.is_none();
            if self.reconnects <= how.reconnects
                && no_cursor
                && let Some(body) = self.body.clone()
            {
                tokio::time::sleep(self.reader.retry.unwrap_or(how.retry)).await;
                match self.send_again(client, session, &body, &how.retry_on).await {
                    Ok(resent) => events = resent,
                    Err(stop) => return stop,
                }
                continue;
            }
            if self.reconnects > how.reconnects || no_cursor {
                let call_id = &self.reader.call_id;
                self.out
                    .failures
                    .push(format!("{call_id}: stream ended without a result"));
                return Stop::Failed;
            }
            tokio::time::sleep(self.reader.retry.unwrap_or(how.retry)).await;
            match self.resume_now(client, session, &how.retry_on).await {
                Ok(resumed) => events = resumed,
                Err(stop) => return stop,
            }
        }
        Stop::Answered
    }

    /// Sends the request `body` again ([`follow::send_again`]); what it got as
    /// [`Tracked::stream_or_stop`] says.
    async fn send_again(
        &mut self,
        client: &McpClient,
        session: &Session,
        body: &Value,
        retry_on: &[StatusCode],
    ) -> Result<Events, Stop> {
        let resent = follow::send_again(client, session, body, retry_on, &mut self.refused).await;
        self.out.resent += 1;
        let resent = resent.map(|r| match r {
            Resumed::Stream(events) => {
                self.out.pods.push(events.pod().to_owned());
                Some(events)
            }
            Resumed::Gone => None,
        });
        self.stream_or_stop(resent)
    }

    /// Reconnects now after the last event read, recording the time to the answer's headers
    /// in [`CallOutcome::resumes`]; a 404 ([`Stop::Gone`]) is counted in
    /// [`CallOutcome::not_found`], any other failure ([`Stop::Failed`]) recorded in
    /// [`CallOutcome::failures`].
    async fn resume_now(
        &mut self,
        client: &McpClient,
        session: &Session,
        retry_on: &[StatusCode],
    ) -> Result<Events, Stop> {
        let started = Instant::now();
        let resumed = self.reconnect(client, session, retry_on).await;
        if let Ok(Some(_)) = resumed {
            self.out.resumes.push(started.elapsed());
        }
        self.stream_or_stop(resumed)
    }

    /// The stream of a reconnect or a request sent again; a 404 is counted in
    /// [`CallOutcome::not_found`] ([`Stop::Gone`]), any other failure recorded in
    /// [`CallOutcome::failures`] ([`Stop::Failed`]).
    fn stream_or_stop(&mut self, answer: Result<Option<Events>, String>) -> Result<Events, Stop> {
        match answer {
            Ok(Some(events)) => Ok(events),
            Ok(None) => {
                self.out.not_found += 1;
                Err(Stop::Gone)
            }
            Err(e) => {
                if let Some(reason) = error_reason(&e) {
                    self.out.announced.get_or_insert_with(|| reason.to_owned());
                }
                self.out.failures.push(e);
                Err(Stop::Failed)
            }
        }
    }
}

/// Attributes the events of one call's stream, across the connections that read it (the
/// first response and every resume): event ids seen twice are duplicated, events whose id names
/// another stream (spec) and messages of other requests are foreign.
#[derive(Clone, Debug)]
struct Reader {
    request_id: u64,
    call_id: String,
    seen_ids: HashSet<String>,
    /// The id of the last event read (priming events included): the cursor to resume from.
    last_id: Option<String>,
    /// The last `retry` hint read: how long to wait before reconnecting (spec R-07).
    retry: Option<Duration>,
}

impl Reader {
    /// A reader of the stream of request `request_id`, a `slow` call with `call_id`.
    fn new(request_id: u64, call_id: &str) -> Self {
        Self {
            request_id,
            call_id: call_id.to_owned(),
            seen_ids: HashSet::new(),
            last_id: None,
            retry: None,
        }
    }

    /// Takes one event into `out`; returns whether it carried a message (priming events and
    /// events without data do not).
    fn take(&mut self, ev: Sse, out: &mut CallOutcome) -> bool {
        if let Some(ms) = ev.retry {
            self.retry = Some(Duration::from_millis(ms));
        }
        let data = ev.data.unwrap_or_default();
        if let Some(id) = ev.id {
            let (key, seq) = id.rsplit_once('-').unwrap_or((id.as_str(), ""));
            if !data.is_empty()
                && let Ok(seq) = seq.parse()
            {
                out.seqs.push(seq);
            }
            if out.stream.get_or_insert_with(|| key.to_owned()) != key {
                out.foreign += 1;
                let pod = out.pod().to_owned();
                out.failures.push(format!(
                    "{}: event {id} of another stream, from {pod}",
                    self.call_id
                ));
            }
            if !data.is_empty() && !self.seen_ids.insert(id.clone()) {
                out.duplicated += 1;
            }
            self.last_id = Some(id);
        }
        if data.is_empty() {
            return false;
        }
        out.events += 1;
        classify(&data, self.request_id, &self.call_id, out);
        true
    }
}

/// Attributes one message to the call, or counts it as foreign (described in the failures) or
/// duplicated.
fn classify(data: &str, request_id: u64, call_id: &str, out: &mut CallOutcome) {
    let foreign = |out: &mut CallOutcome| {
        out.foreign += 1;
        let shown: String = data.chars().take(240).collect();
        let pod = out.pod().to_owned();
        out.failures.push(format!(
            "{call_id} (request {request_id}): foreign message from {pod}: {shown}"
        ));
    };
    let Ok(msg) = serde_json::from_str::<Value>(data) else {
        return foreign(out);
    };
    if msg.get("method").and_then(Value::as_str) == Some("notifications/progress") {
        let token = msg.pointer("/params/progressToken").and_then(Value::as_str);
        let value = msg.pointer("/params/progress").and_then(Value::as_f64);
        match (token, value) {
            (Some(t), Some(p)) if t == call_id => {
                let p = p as u32;
                if out.progress.contains(&p) {
                    out.duplicated += 1;
                } else {
                    out.progress.push(p);
                }
            }
            _ => foreign(out),
        }
        return;
    }
    if msg.get("id") == Some(&Value::from(request_id)) {
        if out.result.is_some() {
            out.duplicated += 1;
        } else if let Some(text) = result_text(&msg) {
            out.result = Some(text.to_owned());
        } else {
            if let Some(reason) = msg.pointer("/error/data/reason").and_then(Value::as_str) {
                out.announced.get_or_insert_with(|| reason.to_owned());
            }
            out.failures.push(format!("{call_id}: error result {msg}"));
            out.result = Some(String::new());
        }
        return;
    }
    foreign(out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_attributed() {
        let mut out = CallOutcome::default();
        let progress = |t: &str, p: u32| {
            json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":t,"progress":p}})
                .to_string()
        };
        classify(&progress("c1", 1), 7, "c1", &mut out);
        classify(&progress("c1", 1), 7, "c1", &mut out);
        classify(&progress("c2", 2), 7, "c1", &mut out);
        classify(
            &json!({"jsonrpc":"2.0","id":8,"result":{}}).to_string(),
            7,
            "c1",
            &mut out,
        );
        classify(
            &json!({"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"done 2"}]}})
                .to_string(),
            7,
            "c1",
            &mut out,
        );
        assert_eq!(out.progress, vec![1]);
        assert_eq!(out.duplicated, 1);
        assert_eq!(out.foreign, 2);
        assert_eq!(out.result.as_deref(), Some("done 2"));
        assert_eq!(out.lost(2), 1, "progress 2 never arrived for c1");
    }

    #[test]
    fn an_error_answer_with_a_reason_announces_what_did_not_arrive() {
        let mut out = CallOutcome::default();
        let progress = json!({"jsonrpc": "2.0", "method": "notifications/progress",
            "params": {"progressToken": "c1", "progress": 1}});
        classify(&progress.to_string(), 7, "c1", &mut out);
        let error = json!({"jsonrpc": "2.0", "id": 7, "error": {"code": -32603,
            "message": "interrupted", "data": {"reason": "handoff_interrupted"}}});
        classify(&error.to_string(), 7, "c1", &mut out);
        assert_eq!(out.announced.as_deref(), Some("handoff_interrupted"));
        let mut report = crate::load::Report::default();
        report.record_call("c1", 3, Ok(out));
        assert_eq!(
            (report.lost, report.announced_lost, report.lost_silently()),
            (2, 2, 0)
        );
        assert_eq!(report.announced["handoff_interrupted"], 1);
        assert!(report.incidents.is_empty(), "{:?}", report.incidents);
    }
}
