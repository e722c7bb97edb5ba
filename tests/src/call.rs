//! One `slow` tool call as a client experiences it, checked event by event.
//!
//! The call's progress token is its `call_id`, so every message can be attributed: a progress
//! notification with another token, or a response with another id, is *foreign*; a progress
//! value or result received twice, or an event id seen twice, is *duplicated*; a progress value
//! or the result never received is *lost*. The client cuts its connection after the planned
//! numbers of messages and resumes with `GET` + `Last-Event-ID`, as the spec tells clients to
//! a stream that ends before the result is resumed the same way. A resume answered
//! 404 ends the call: the session is gone (S-05), the rest of its events are lost.
//!
//! [`Reader`] does the attribution for any reader of a call's stream, so scenarios that drive
//! the connections themselves (the fault-injection tests) check events the same way; it also
//! counts an event whose id names another stream as foreign.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::{Value, json};
use sse_stream::Sse;

use crate::client::{
    Events, McpClient, Session, body_text, is_sse, result_text, tool_call, unexpected,
};
use crate::{HarnessError, Result};

/// Longest silence on a stream before the call is declared stuck.
pub const STALL: Duration = Duration::from_secs(20);
/// Most resumes after the stream ended without a result (server-side closes).
const MAX_RECONNECTS: u32 = 20;

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
            count,
            interval_ms,
            cuts,
            pause: Duration::from_millis(rand::random_range(0..=max_pause_ms)),
            close_after: None,
        }
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
}

impl CallOutcome {
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

/// Runs `slow` as request `request_id` with `call_id` (also its progress token).
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
    let mut args =
        json!({"count": plan.count, "interval_ms": plan.interval_ms, "call_id": call_id});
    if let Some(k) = plan.close_after {
        args["close_after"] = json!(k);
    }
    let body = tool_call(request_id, "slow", args, Some(call_id));
    let resp = client.post(Some(session), &body, &[]).await?;
    let mut out = CallOutcome::default();
    if resp.status() != StatusCode::OK {
        return Err(unexpected("tools/call slow", resp).await);
    }
    if !is_sse(&resp) {
        return Err(HarnessError::Protocol(format!(
            "slow answered without SSE: {}",
            body_text(resp).await?
        )));
    }
    let mut events = Events::new(resp);
    let mut reader = Reader::new(request_id, call_id);
    let mut cuts = plan.cuts.iter().copied().peekable();
    let mut messages = 0u32;
    let mut reconnects = 0;
    while out.result.is_none() {
        let Some(ev) = events.next_within(STALL).await else {
            // The stream ended (or stalled) before the result: resume like EventSource would.
            reconnects += 1;
            let Some(cursor) = reader
                .last_id
                .clone()
                .filter(|_| reconnects <= MAX_RECONNECTS)
            else {
                out.failures
                    .push(format!("{call_id}: stream ended without a result"));
                break;
            };
            // A server that closed the stream with a `retry` hint is reconnected to after it,
            // as EventSource does (spec R-07).
            if let Some(wait) = reader.retry.take() {
                tokio::time::sleep(wait).await;
            }
            match resume(client, session, &cursor, &mut out).await {
                Some(e) => events = e,
                None => break,
            }
            continue;
        };
        if !reader.take(ev, &mut out) {
            continue; // priming event
        }
        messages += 1;
        if out.result.is_none() && cuts.peek() == Some(&messages) {
            cuts.next();
            drop(events);
            tokio::time::sleep(plan.pause).await;
            let Some(cursor) = reader.last_id.clone() else {
                out.failures
                    .push(format!("{call_id}: no event id to resume from"));
                break;
            };
            match resume(client, session, &cursor, &mut out).await {
                Some(e) => events = e,
                None => break,
            }
        }
    }
    Ok(out)
}

/// Attributes the events of one call's stream, across the connections that read it (the
/// first response and every resume): event ids seen twice are duplicated, events whose id names
/// another stream (spec) and messages of other requests are foreign.
#[derive(Clone, Debug)]
pub struct Reader {
    request_id: u64,
    call_id: String,
    seen_ids: HashSet<String>,
    /// The stream key of the first event id (`<key>-<seq>`).
    stream: Option<String>,
    /// The id of the last event read (priming events included): the cursor to resume from.
    pub last_id: Option<String>,
    /// The last `retry` hint read: how long to wait before reconnecting (spec R-07).
    pub retry: Option<Duration>,
}

impl Reader {
    /// A reader of the stream of request `request_id`, a `slow` call with `call_id`.
    pub fn new(request_id: u64, call_id: &str) -> Self {
        Self {
            request_id,
            call_id: call_id.to_owned(),
            seen_ids: HashSet::new(),
            stream: None,
            last_id: None,
            retry: None,
        }
    }

    /// The key of the stream read (from the first event id).
    pub fn stream(&self) -> Option<&str> {
        self.stream.as_deref()
    }

    /// Takes one event into `out`; returns whether it carried a message (priming events and
    /// events without data do not).
    pub fn take(&mut self, ev: Sse, out: &mut CallOutcome) -> bool {
        if let Some(ms) = ev.retry {
            self.retry = Some(Duration::from_millis(ms));
        }
        let data = ev.data.unwrap_or_default();
        if let Some(id) = ev.id {
            let key = id.rsplit_once('-').map_or(id.as_str(), |(key, _)| key);
            if self.stream.get_or_insert_with(|| key.to_owned()) != key {
                out.foreign += 1;
                out.failures
                    .push(format!("{}: event {id} of another stream", self.call_id));
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

    /// Reads `events` into `out` until the call's answer arrived, the stream ended, or nothing
    /// came for `within`; returns whether the stream ended or stalled before the answer.
    pub async fn read(
        &mut self,
        events: &mut Events,
        out: &mut CallOutcome,
        within: Duration,
    ) -> bool {
        while out.result.is_none() {
            match events.next_within(within).await {
                Some(ev) => {
                    self.take(ev, out);
                }
                None => return true,
            }
        }
        false
    }
}

async fn resume(
    client: &McpClient,
    session: &Session,
    cursor: &str,
    out: &mut CallOutcome,
) -> Option<Events> {
    let started = Instant::now();
    match client.get(session, Some(cursor)).await {
        Ok(resp) if resp.status() == StatusCode::OK && is_sse(&resp) => {
            out.resumes.push(started.elapsed());
            Some(Events::new(resp))
        }
        Ok(resp) if resp.status() == StatusCode::NOT_FOUND => {
            out.not_found += 1;
            None
        }
        Ok(resp) => {
            let status = resp.status();
            let body = body_text(resp).await.unwrap_or_default();
            out.failures
                .push(format!("resume answered {status}: {body:.200}"));
            None
        }
        Err(e) => {
            out.failures.push(format!("resume failed: {e}"));
            None
        }
    }
}

/// Attributes one message to the call, or counts it as foreign or duplicated.
fn classify(data: &str, request_id: u64, call_id: &str, out: &mut CallOutcome) {
    let Ok(msg) = serde_json::from_str::<Value>(data) else {
        out.foreign += 1;
        return;
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
            _ => out.foreign += 1,
        }
        return;
    }
    if msg.get("id") == Some(&Value::from(request_id)) {
        if out.result.is_some() {
            out.duplicated += 1;
        } else if let Some(text) = result_text(&msg) {
            out.result = Some(text.to_owned());
        } else {
            out.failures.push(format!("{call_id}: error result {msg}"));
            out.result = Some(String::new());
        }
        return;
    }
    out.foreign += 1;
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
}
