//! Following a stream like EventSource: reconnect with `GET` + `Last-Event-ID` after the last
//! event read, wait the `retry` hint first (spec R-07), send a reconnect refused with 429 or 503
//! again after its `Retry-After`, and stop at 404: the session is gone (spec R-03, S-05).
//!
//! [`reconnect`] is one reconnect; [`crate::call::Tracked::follow`] follows a `slow` call's
//! stream to its answer with it, on a [`Follow`] policy, and [`call_to_answer`] any other tool
//! call's.

use std::time::Duration;

use http::{Response, StatusCode};
use hyper::body::Incoming;
use serde_json::Value;

use crate::client::{
    Events, McpClient, Session, body_text, error_reason, expect_lost_session, header_str, is_sse,
    json_error, messages, parse,
};
use crate::{HarnessError, Result};

/// Most times [`reconnect`] sends a refused reconnect again.
const REFUSALS: usize = 30;

/// How a follower reconnects.
#[derive(Clone, Debug)]
pub struct Follow {
    /// Longest silence on a stream before it counts as ended.
    pub stall: Duration,
    /// The wait before a reconnect when the stream sent no `retry` hint.
    pub retry: Duration,
    /// Statuses of a refused reconnect to send again after its `Retry-After` (e.g. 429, 503);
    /// empty: none (a client [`McpClient::honouring_retry_after`] does it itself).
    pub retry_on: Vec<StatusCode>,
    /// Most reconnects after the stream ended before the answer, over a call.
    pub reconnects: u32,
}

impl Default for Follow {
    /// A stall of [`crate::call::STALL`], no wait without a hint, no refusal retried, 20
    /// reconnects.
    fn default() -> Self {
        Self {
            stall: crate::call::STALL,
            retry: Duration::ZERO,
            retry_on: Vec::new(),
            reconnects: 20,
        }
    }
}

/// A reconnect refused with `Retry-After`, then sent again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The status (429, 503).
    pub status: StatusCode,
    /// `data.reason` of its JSON-RPC error, e.g. `resume_budget`.
    pub reason: String,
    /// The `Retry-After` seconds.
    pub retry_after: u64,
}

/// What a reconnect got.
#[derive(Debug)]
pub enum Resumed {
    /// 200 and the stream.
    Stream(Events),
    /// The 404 of a lost session (spec S-05).
    Gone,
}

/// The `Retry-After` of a 429 or 503 answer, in seconds.
pub fn retry_after<B>(resp: &Response<B>) -> Option<u64> {
    let busy = matches!(
        resp.status(),
        StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS
    );
    let secs = header_str(resp, "retry-after").and_then(|v| v.parse().ok());
    secs.filter(|_| busy)
}

/// Reconnects to `session`'s stream via `client`, after `cursor` when given. A refusal whose
/// status is in `retry_on` and that carries `Retry-After` is sent again after the wait it names,
/// at most 30 times, each recorded in `refused`.
///
/// # Errors
/// What the answer was, when it is neither a stream nor the 404 of a lost session (a 404 of
/// another shape included), or a refusal that is not a JSON-RPC error.
pub async fn reconnect(
    client: &McpClient,
    session: &Session,
    cursor: Option<&str>,
    retry_on: &[StatusCode],
    refused: &mut Vec<Refusal>,
) -> Result<Resumed, String> {
    let what = format!("resume after {}", cursor.unwrap_or("the start"));
    let get = || client.get(session, cursor);
    answered(&what, get, retry_on, refused).await
}

/// Sends request `body` of `session` again via `client` (tether's retry: the same id and body
/// attach to the running request or replay its answer, never run it twice), when its stream
/// ended before any event id the client could resume from; refusals as [`reconnect`].
///
/// # Errors
/// As [`reconnect`].
pub async fn send_again(
    client: &McpClient,
    session: &Session,
    body: &Value,
    retry_on: &[StatusCode],
    refused: &mut Vec<Refusal>,
) -> Result<Resumed, String> {
    let post = || client.post(Some(session), body, &[]);
    answered("the request sent again", post, retry_on, refused).await
}

/// The stream `send` answers with (`what` names the request in errors), sending it again after
/// each refusal in `retry_on` with `Retry-After`.
async fn answered<F, Fut>(
    what: &str,
    send: F,
    retry_on: &[StatusCode],
    refused: &mut Vec<Refusal>,
) -> Result<Resumed, String>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Response<Incoming>>>,
{
    for _ in 0..REFUSALS {
        let resp = send().await.map_err(|e| format!("{what} failed: {e}"))?;
        let status = resp.status();
        if status == StatusCode::OK && is_sse(&resp) {
            return Ok(Resumed::Stream(Events::new(resp)));
        }
        if status == StatusCode::NOT_FOUND {
            expect_lost_session(resp)
                .await
                .map_err(|e| format!("{what}: {e}"))?;
            return Ok(Resumed::Gone);
        }
        match retry_after(&resp).filter(|_| retry_on.contains(&status)) {
            Some(secs) => {
                let (_, error) = json_error(resp).await.map_err(|e| format!("{what}: {e}"))?;
                let reason = error["data"]["reason"].as_str().unwrap_or_default();
                refused.push(Refusal {
                    status,
                    reason: reason.to_owned(),
                    retry_after: secs,
                });
                tokio::time::sleep(Duration::from_secs(secs)).await;
            }
            None => {
                let body = body_text(resp).await.unwrap_or_default();
                // A JSON-RPC error whole, so that its `data.reason` stays readable.
                let shown = if error_reason(&body).is_some() {
                    2000
                } else {
                    200
                };
                return Err(format!("{what} answered {status}: {body:.shown$}"));
            }
        }
    }
    Err(format!("{what} refused {REFUSALS} times: {refused:?}"))
}

/// Checks that a resume after `cursor`, the last event of a complete stream, is a 200 stream
/// that ends cleanly without a message (at most a priming event with a fresh id, spec R-05).
///
/// # Errors
/// [`HarnessError::Protocol`] naming what came instead.
pub async fn nothing_after(client: &McpClient, session: &Session, cursor: &str) -> Result<()> {
    let resp = client.get(session, Some(cursor)).await?;
    if resp.status() != StatusCode::OK || !is_sse(&resp) {
        return Err(HarnessError::Protocol(format!(
            "resume after {cursor} answered {}",
            resp.status()
        )));
    }
    let events = Events::new(resp).rest(Duration::from_secs(5)).await?;
    let again = events.iter().any(|e| {
        e.data.as_deref().is_some_and(|d| !d.is_empty()) || e.id.as_deref() == Some(cursor)
    });
    if again {
        return Err(HarnessError::Protocol(format!(
            "resume after {cursor} yielded {events:?}"
        )));
    }
    Ok(())
}

/// `tools/call` `name` with `arguments` as request `id`, followed to its answer as `how` says:
/// a stream that ends before the response to `id` (a session handed off closes its clients'
/// streams with a `retry` hint, spec) is resumed after its last event. Returns every
/// message received, the answer last.
///
/// # Errors
/// [`HarnessError`] when the POST is not answered 200, or the stream cannot be followed to the
/// answer (no event id to resume from, a resume refused or answered 404, `how.reconnects`
/// spent).
pub async fn call_to_answer(
    client: &McpClient,
    session: &Session,
    id: u64,
    name: &str,
    arguments: Value,
    how: &Follow,
) -> Result<Vec<Value>> {
    let resp = client.post_call(session, id, name, arguments).await?;
    if !is_sse(&resp) {
        return messages(resp, how.stall).await;
    }
    let (mut events, mut out) = (Events::new(resp), Vec::new());
    let (mut cursor, mut hint) = (None, None);
    for _ in 0..=how.reconnects {
        while let Some(ev) = events.next_within(how.stall).await {
            cursor = ev.id.or(cursor);
            hint = ev.retry.map(Duration::from_millis).or(hint);
            let Some(data) = ev.data.filter(|d| !d.is_empty()) else {
                continue;
            };
            let message = parse(&data)?;
            let answered = message.get("id").and_then(Value::as_u64) == Some(id);
            out.push(message);
            if answered {
                return Ok(out);
            }
        }
        let Some(after) = cursor.as_deref() else {
            break;
        };
        tokio::time::sleep(hint.unwrap_or(how.retry)).await;
        match reconnect(client, session, Some(after), &how.retry_on, &mut Vec::new()).await {
            Ok(Resumed::Stream(resumed)) => events = resumed,
            Ok(Resumed::Gone) => {
                return Err(HarnessError::Status {
                    what: format!("resume of tools/call {name}"),
                    status: StatusCode::NOT_FOUND,
                    body: String::new(),
                });
            }
            Err(e) => return Err(HarnessError::Protocol(format!("tools/call {name}: {e}"))),
        }
    }
    Err(HarnessError::Protocol(format!(
        "tools/call {name}: the stream ended without the answer, after {out:?}"
    )))
}
