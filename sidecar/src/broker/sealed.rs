//! The MCP server's values a client holds sealed (`crate::mcp::sealed`), exchanged on their
//! way through the pod: opened in a client's request before it goes to the MCP server, sealed
//! in the server's answer before it goes to the client.
//!
//! - Task ids (`docs/design/tasks.md`, `crate::mcp::tasks`), in both eras: 2026-07-28
//!   requests (`broker::stateless`) and 2025-11-25 sessions (`broker::post`, `broker::pump`).
//! - The `requestState` of multi round-trip requests (`crate::mcp::mrtr`), 2026-07-28 only:
//!   MRTR does not exist in the session era, whose requests follow their session anyway.
//!
//! Most messages hold neither: the body is searched for the field names first, and only a
//! body that spells one is parsed.

use std::time::Instant;

use bytes::Bytes;
use serde_json::Value;

use super::Broker;
use crate::mcp::home::HomeToken;
use crate::mcp::jsonrpc::{Envelope, Message};
use crate::mcp::mrtr;
use crate::mcp::principal::Owner;
use crate::mcp::rejection::Rejection;
use crate::mcp::tasks::{self, Revision, Seen};

/// A field name a message spells when it may hold a sealed value.
struct Field(memchr::memmem::Finder<'static>);

impl Field {
    fn in_(&self, json: &[u8]) -> bool {
        self.0.find(json).is_some()
    }
}

/// Every task id travels under this key.
static TASK_ID: std::sync::LazyLock<Field> =
    std::sync::LazyLock::new(|| Field(memchr::memmem::Finder::new(b"\"taskId\"")));
/// Every request state travels under this key.
static REQUEST_STATE: std::sync::LazyLock<Field> =
    std::sync::LazyLock::new(|| Field(memchr::memmem::Finder::new(b"\"requestState\"")));

/// Whether `json` may hold a value sealed in `revision`.
fn may_hold(json: &[u8], revision: Revision) -> (bool, bool) {
    let states = revision == Revision::Extension && REQUEST_STATE.in_(json);
    (TASK_ID.in_(json), states)
}

impl Broker {
    /// The body the MCP server gets for a client's `body` (parsed as `envelope`, whose messages
    /// are opened in place; methods of `revision`; the request presents `owner`, made only when
    /// the body holds a sealed value): each task id and `requestState` opened to the server's.
    /// With it, the server's id of the task a request of a `tasks/*` method names (its
    /// `Mcp-Name` for a 2026-07-28 request).
    ///
    /// # Errors
    /// [`Rejection::TaskNotFound`]: an id this endpoint did not issue (or issued to another
    /// owner), or of a task held by another pod; [`Rejection::RequestStateInvalid`]: a state
    /// this endpoint did not seal for `owner`.
    pub(crate) fn open_sealed(
        &self,
        envelope: &mut Envelope,
        body: Bytes,
        revision: Revision,
        owner: impl FnOnce() -> Owner,
    ) -> Result<(Bytes, Option<String>), Rejection> {
        let (task_ids, states) = may_hold(&body, revision);
        if !task_ids && !states {
            return Ok((body, None));
        }
        let me = self.tasks.ids.home();
        let owner = owner();
        let mut named = None;
        for (parsed, message) in &mut envelope.messages {
            if task_ids
                && let Some(task) = tasks::open(message, &self.tasks.ids, me, revision, &owner)
                    .map_err(Rejection::TaskNotFound)?
            {
                named = Some(task.upstream);
            }
            let retry = matches!(parsed, Message::Request { method, .. } if mrtr::may_require_input(method));
            if states && retry {
                mrtr::open(message, &self.request_states, &owner)
                    .map_err(|_| Rejection::RequestStateInvalid)?;
            }
        }
        let messages = envelope.messages.iter().map(|(_, m)| m);
        let json = if envelope.batch {
            serde_json::to_vec(&messages.collect::<Vec<_>>())
        } else {
            serde_json::to_vec(&envelope.messages[0].1)
        };
        let json = json.map_err(|e| Rejection::InvalidRequest(e.to_string()))?;
        Ok((Bytes::from(json), named))
    }

    /// One JSON text from the MCP server (a message, or a batch of them: an SSE event's data or
    /// a JSON body) answering a request of `revision`, with its task ids and (2026-07-28) its
    /// request states sealed for `owner`; `None` when it holds none (or is not JSON, which the
    /// client's SDK reports).
    ///
    /// # Errors
    /// [`Rejection::TaskIdTooLong`], [`Rejection::RequestStateTooLong`].
    pub(crate) fn seal_answer(
        &self,
        json: &[u8],
        owner: &Owner,
        revision: Revision,
    ) -> Result<Option<Vec<u8>>, Rejection> {
        let (task_ids, states) = may_hold(json, revision);
        if !task_ids && !states {
            return Ok(None);
        }
        let Ok(mut value) = serde_json::from_slice::<Value>(json) else {
            return Ok(None);
        };
        let now = Instant::now();
        let mut ended = false;
        let mut seen = |task: Seen| {
            ended |= task.terminal;
            if !self.tasks.note(task, owner, now) {
                self.metrics.task_untracked();
            }
        };
        let mut changed = false;
        let messages = match &mut value {
            Value::Array(batch) => batch.iter_mut().collect(),
            single => vec![single],
        };
        for message in messages {
            if task_ids {
                changed |= tasks::seal(message, &self.tasks.ids, owner, &mut seen)
                    .map_err(|_| Rejection::TaskIdTooLong)?;
            }
            if states {
                changed |= mrtr::seal(message, &self.request_states, owner)
                    .map_err(|_| Rejection::RequestStateTooLong)?;
            }
        }
        if task_ids {
            self.metrics.tasks_open(self.tasks.kept());
        }
        if ended {
            // A drain may be waiting for this task.
            self.activity().notify_waiters();
        }
        if !changed {
            return Ok(None);
        }
        serde_json::to_vec(&value)
            .map(Some)
            .map_err(|_| Rejection::UpstreamLost)
    }

    /// The pod that issued the `requestState` a 2026-07-28 request (`message`, with `headers`)
    /// retries with, when it is genuine and the request presents its owner (routing).
    pub(crate) fn request_state_issuer(
        &self,
        message: &Value,
        headers: &http::HeaderMap,
    ) -> Option<HomeToken> {
        mrtr::issuer(message, &self.request_states, &self.request_owner(headers))
    }
}
