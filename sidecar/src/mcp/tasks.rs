//! Where task ids travel in MCP messages, and their exchange between the client's sealed ids and
//! the MCP server's own (`docs/design/tasks.md`; the ids: [`super::task_id`]).
//!
//! Both task revisions put ids in the same few places, which are the only ones touched (a tool's
//! own result that happens to hold a `taskId` field is left alone):
//!
//! | message | field | revision |
//! |---|---|---|
//! | `tasks/get`, `tasks/update`, `tasks/cancel`, `tasks/result` requests | `params.taskId` | both (`tasks/result`: 2025-11-25) |
//! | a result shaped as a task (`status` and `createdAt`): `CreateTaskResult`, `tasks/get` | `result.taskId` | both |
//! | `CreateTaskResult` of 2025-11-25 | `result.task.taskId` | 2025-11-25 |
//! | `tasks/list` result | `result.tasks[].taskId` | 2025-11-25 |
//! | `notifications/tasks/status` | `params.taskId` | both |
//! | any message | `_meta["io.modelcontextprotocol/related-task"].taskId` in `params` or `result` | 2025-11-25 |
//!
//! The server-to-client direction seals each id ([`seal`]); the client-to-server direction opens
//! them ([`open`]), and an id that does not open is the spec's not-found error (-32602, tasks
//! extension "Error Handling"). Each task object seen on its way to a client is reported
//! ([`Seen`]) so the pod knows which of its tasks a client may still poll.

use serde_json::Value;

use super::home::HomeToken;
use super::methods::{
    LISTEN, TASK_NOTIFICATIONS, TASKS_CANCEL, TASKS_GET, TASKS_RESULT, TASKS_UPDATE, TOOLS_CALL,
};
use super::principal::Owner;
use super::sealed::{Opened, SealError, Sealer};

/// The `_meta` key that ties a message to a task (2025-11-25 tasks, "Associating Task-Related
/// Messages").
pub(crate) const RELATED_TASK: &str = "io.modelcontextprotocol/related-task";

/// The task methods a request may use: those of the tasks extension (2026-07-28), or also
/// those of the 2025-11-25 experimental tasks (a session's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Revision {
    /// A 2025-era session: `tasks/result` and `tasks/list` exist too.
    Session,
    /// A 2026-07-28 request: `tasks/result` is removed (the MCP server answers it -32601, so
    /// tether passes it on untouched).
    Extension,
}

/// Whether requests of `method` name their task in `params.taskId` in `revision`.
pub(crate) fn names_task(method: &str, revision: Revision) -> bool {
    match method {
        TASKS_GET | TASKS_UPDATE | TASKS_CANCEL => true,
        TASKS_RESULT => revision == Revision::Session,
        _ => false,
    }
}

/// Whether a 2026-07-28 request of `method` may be answered with task ids: it names a task, may
/// create one (`tools/call`) or streams notifications (`subscriptions/listen`).
pub(crate) fn may_answer_with_tasks(method: &str) -> bool {
    names_task(method, Revision::Extension) || matches!(method, TOOLS_CALL | LISTEN)
}

/// A task object a message carried to the client: its MCP server id, whether its status is
/// terminal (`completed`, `failed`, `cancelled`), and its `ttlMs` when it gave one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Seen {
    /// The MCP server's task id.
    pub(crate) upstream: String,
    /// The status is terminal: no poll will find it working again.
    pub(crate) terminal: bool,
    /// `ttlMs`, when a number.
    pub(crate) ttl_ms: Option<u64>,
}

/// Why a client's message cannot go to the MCP server.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TaskMiss {
    /// A task id that does not open (forged, altered, of a retired key), or not a string.
    #[error("the task id is not one this endpoint issued")]
    Unknown,
    /// A genuine id of a task held by another pod that this request could not reach.
    #[error("the pod that held the task is gone")]
    Gone,
}

/// Seals the MCP server's task ids in `message` (one JSON-RPC message from the server) in place,
/// for `owner` (the principal of the request it answers); `seen` is called for every task
/// object. Returns whether anything changed.
///
/// # Errors
/// [`SealError::TooLong`]: an id tether cannot seal (the message must not reach the client).
pub(crate) fn seal(
    message: &mut Value,
    ids: &Sealer,
    owner: &Owner,
    seen: &mut dyn FnMut(Seen),
) -> Result<bool, SealError> {
    let mut changed = false;
    if let Some(result) = message.get_mut("result").filter(|r| r.is_object()) {
        if is_task(result) {
            changed |= seal_task(result, ids, owner, seen)?;
        }
        if let Some(task) = result.get_mut("task").filter(|t| is_task(t)) {
            changed |= seal_task(task, ids, owner, seen)?;
        }
        if let Some(Value::Array(tasks)) = result.get_mut("tasks") {
            for task in tasks.iter_mut().filter(|t| is_task(t)) {
                changed |= seal_task(task, ids, owner, seen)?;
            }
        }
        changed |= seal_related(result, ids, owner)?;
    }
    let status_notification = message
        .get("method")
        .and_then(Value::as_str)
        .is_some_and(|m| m.starts_with(TASK_NOTIFICATIONS));
    if let Some(params) = message.get_mut("params").filter(|p| p.is_object()) {
        if status_notification {
            changed |= seal_task(params, ids, owner, seen)?;
        }
        changed |= seal_related(params, ids, owner)?;
    }
    Ok(changed)
}

/// Opens the client's task ids in `message` (one JSON-RPC message from the client of
/// `revision`, presenting `owner`) in place, for the pod `me`. Returns the task a request of a [`names_task`] method
/// names, if any.
///
/// # Errors
/// [`TaskMiss::Unknown`] for an id that does not open (another owner's too); [`TaskMiss::Gone`] for a genuine id held
/// by another pod (the request reached this pod because the holder is gone).
pub(crate) fn open(
    message: &mut Value,
    ids: &Sealer,
    me: HomeToken,
    revision: Revision,
    owner: &Owner,
) -> Result<Option<Opened>, TaskMiss> {
    let open_field = |field: &mut Value| -> Result<Opened, TaskMiss> {
        let opened = field
            .as_str()
            .ok_or(TaskMiss::Unknown)
            .and_then(|id| ids.open(id, owner).map_err(|_| TaskMiss::Unknown))?;
        if opened.home != me {
            return Err(TaskMiss::Gone);
        }
        *field = Value::String(opened.upstream.clone());
        Ok(opened)
    };
    let named = message
        .get("method")
        .and_then(Value::as_str)
        .is_some_and(|m| names_task(m, revision));
    let mut target = None;
    for part in ["params", "result"] {
        let Some(body) = message.get_mut(part).filter(|p| p.is_object()) else {
            continue;
        };
        if part == "params" && named {
            let id = body.get_mut("taskId").ok_or(TaskMiss::Unknown)?;
            target = Some(open_field(id)?);
        }
        if let Some(id) = related_task(body) {
            open_field(id)?;
        }
    }
    if named && target.is_none() {
        return Err(TaskMiss::Unknown);
    }
    Ok(target)
}

/// What a task lost with its pod tells the client that polls it.
const LOST_TASK: &str = "the pod that ran this task is gone (its drain ended before the task \
     did, or it stopped without one): the task's outcome is lost";

/// The answer to `request` (the client's message, its sealed task id as sent), a `tasks/get`
/// of a task whose pod is gone ([`TaskMiss::Gone`]): the task in its terminal status
/// `failed`, so that the client stops polling and learns the outcome is lost, rather than a
/// not-found that says the id was never valid. Its times are `now` (RFC 3339): the pod that
/// knew when it was created is gone. `None` for other methods (they keep the not-found error).
pub(crate) fn lost_task_answer(request: &Value, revision: Revision, now: &str) -> Option<Value> {
    if request.get("method").and_then(Value::as_str) != Some(TASKS_GET) {
        return None;
    }
    let task_id = request.pointer("/params/taskId")?.as_str()?;
    let mut task = serde_json::json!({
        "taskId": task_id,
        "status": "failed",
        "statusMessage": LOST_TASK,
        "createdAt": now,
        "lastUpdatedAt": now,
    });
    match revision {
        // 2025-11-25 tasks: `ttl`, and the error waits for `tasks/result`.
        Revision::Session => task["ttl"] = Value::Null,
        // The tasks extension inlines a failed task's error in `tasks/get`.
        Revision::Extension => {
            task["resultType"] = "complete".into();
            task["ttlMs"] = Value::Null;
            task["error"] = serde_json::json!({
                "code": crate::mcp::jsonrpc::CODE_INTERNAL,
                "message": LOST_TASK,
                "data": {"reason": "task_gone"},
            });
        }
    }
    Some(serde_json::json!({"jsonrpc": "2.0", "id": request.get("id")?, "result": task}))
}

/// The holder of the task a client's `Mcp-Name` names, when it is a genuine task id (routing;
/// the body is checked against the header before the request is served).
pub(crate) fn holder(ids: &Sealer, name: &str, owner: &Owner) -> Option<HomeToken> {
    ids.open(name, owner).ok().map(|t| t.home)
}

/// A task object: `status` and `createdAt` strings beside its `taskId`.
fn is_task(v: &Value) -> bool {
    v.get("taskId").is_some_and(Value::is_string)
        && v.get("status").is_some_and(Value::is_string)
        && v.get("createdAt").is_some_and(Value::is_string)
}

/// Seals `task`'s `taskId` (a string) and reports the task to `seen`; whether it did.
fn seal_task(
    task: &mut Value,
    ids: &Sealer,
    owner: &Owner,
    seen: &mut dyn FnMut(Seen),
) -> Result<bool, SealError> {
    let terminal = matches!(
        task.get("status").and_then(Value::as_str),
        Some("completed" | "failed" | "cancelled")
    );
    let ttl_ms = task.get("ttlMs").and_then(Value::as_u64);
    let Some(Value::String(upstream)) = task.get_mut("taskId") else {
        return Ok(false);
    };
    let sealed = ids.mint(upstream, owner)?;
    seen(Seen {
        upstream: std::mem::replace(upstream, sealed),
        terminal,
        ttl_ms,
    });
    Ok(true)
}

/// Seals the related-task id in `body`'s `_meta`, when present; whether it did.
fn seal_related(body: &mut Value, ids: &Sealer, owner: &Owner) -> Result<bool, SealError> {
    let Some(Value::String(upstream)) = related_task(body) else {
        return Ok(false);
    };
    *upstream = ids.mint(upstream, owner)?;
    Ok(true)
}

/// `body._meta["io.modelcontextprotocol/related-task"].taskId`, when present.
fn related_task(body: &mut Value) -> Option<&mut Value> {
    body.get_mut("_meta")?
        .get_mut(RELATED_TASK)?
        .get_mut("taskId")
        .filter(|id| id.is_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::KeyRing;

    /// Tasks of anonymous requests.
    const ANON: Owner = Owner::ANONYMOUS;
    use serde_json::json;

    fn ids(pod: &str) -> Sealer {
        Sealer::new(
            KeyRing::from_bytes(b"0123456789abcdef".to_vec()),
            HomeToken::for_pod(pod),
            &crate::mcp::sealed::TASK_ID,
        )
    }

    fn task(id: &str, status: &str) -> Value {
        json!({"taskId": id, "status": status, "createdAt": "2026-12-04T00:00:00Z",
            "lastUpdatedAt": "2026-12-04T00:00:00Z", "ttlMs": 60000, "pollIntervalMs": 100})
    }

    /// A poll of a task lost with its pod gets the task failed, in each revision's shape;
    /// other requests naming it keep the not-found error.
    #[test]
    fn a_poll_of_a_lost_task_gets_it_failed() {
        let now = "2026-12-05T20:00:00Z";
        let get = json!({"jsonrpc": "2.0", "id": 3, "method": "tasks/get",
            "params": {"taskId": "sealed-1"}});
        let table = [
            (Revision::Extension, "ttlMs", true),
            (Revision::Session, "ttl", false),
        ];
        for (revision, ttl, inline_error) in table {
            let answer = lost_task_answer(&get, revision, now).unwrap();
            assert_eq!(answer["id"], 3);
            let task = &answer["result"];
            assert!(is_task(task), "{task}");
            assert_eq!(task["taskId"], "sealed-1");
            assert_eq!(task["status"], "failed");
            assert_eq!(
                (task["createdAt"].as_str(), task["lastUpdatedAt"].as_str()),
                (Some(now), Some(now))
            );
            assert!(task[ttl].is_null(), "{task}");
            assert_eq!(
                task["error"]["data"]["reason"] == "task_gone",
                inline_error,
                "{task}"
            );
        }
        for method in ["tasks/cancel", "tasks/update", "tasks/result"] {
            let mut other = get.clone();
            other["method"] = json!(method);
            assert_eq!(
                lost_task_answer(&other, Revision::Session, now),
                None,
                "{method}"
            );
        }
    }

    fn sealed_all(mut message: Value, ids: &Sealer) -> (Value, Vec<Seen>) {
        let mut seen = Vec::new();
        seal(&mut message, ids, &ANON, &mut |s| seen.push(s)).unwrap();
        (message, seen)
    }

    /// Tasks extension (2026-07-28), "Creating Tasks": `CreateTaskResult` carries `resultType:
    /// "task"` and the task's fields; the client sees a sealed id, and the pod notes the task
    /// as open.
    #[test]
    fn a_create_task_result_is_sealed_and_seen_open() {
        let a = ids("a");
        let mut result = task("t-1", "working");
        result["resultType"] = json!("task");
        let (out, seen) = sealed_all(json!({"jsonrpc": "2.0", "id": 1, "result": result}), &a);
        let id = out["result"]["taskId"].as_str().unwrap();
        assert_ne!(id, "t-1");
        assert_eq!(a.open(id, &ANON).unwrap().upstream, "t-1");
        assert_eq!(
            seen,
            [Seen {
                upstream: "t-1".into(),
                terminal: false,
                ttl_ms: Some(60000)
            }]
        );
    }

    /// 2025-11-25 tasks: `CreateTaskResult` nests the task, `tasks/list` lists them, and
    /// related messages name it in `_meta`.
    #[test]
    fn the_2025_11_25_places_are_sealed() {
        let a = ids("a");
        let (created, _) = sealed_all(
            json!({"jsonrpc": "2.0", "id": 1, "result": {"task": task("t-1", "working")}}),
            &a,
        );
        assert_eq!(
            a.open(created["result"]["task"]["taskId"].as_str().unwrap(), &ANON)
                .unwrap()
                .upstream,
            "t-1"
        );
        let (listed, seen) = sealed_all(
            json!({"jsonrpc": "2.0", "id": 2, "result": {"tasks": [task("t-1", "completed"), task("t-2", "working")]}}),
            &a,
        );
        assert_eq!(seen.len(), 2);
        assert!(seen[0].terminal && !seen[1].terminal);
        assert_eq!(
            listed["result"]["tasks"][0]["taskId"],
            created["result"]["task"]["taskId"]
        );
        let (related, seen) = sealed_all(
            json!({"jsonrpc": "2.0", "id": 3, "method": "elicitation/create",
                "params": {"_meta": {RELATED_TASK: {"taskId": "t-1"}}}}),
            &a,
        );
        assert!(seen.is_empty());
        assert_eq!(
            related["params"]["_meta"][RELATED_TASK]["taskId"],
            created["result"]["task"]["taskId"]
        );
    }

    #[test]
    fn a_status_notification_is_sealed_and_a_terminal_status_seen() {
        let a = ids("a");
        let (out, seen) = sealed_all(
            json!({"jsonrpc": "2.0", "method": "notifications/tasks/status", "params": task("t-9", "failed")}),
            &a,
        );
        assert_ne!(out["params"]["taskId"], "t-9");
        assert!(seen[0].terminal);
    }

    #[test]
    fn a_tool_result_holding_a_task_id_of_its_own_is_left_alone() {
        let a = ids("a");
        let message = json!({"jsonrpc": "2.0", "id": 1, "result": {
            "content": [{"type": "text", "text": "ok"}],
            "structuredContent": {"taskId": "JIRA-1", "status": "open", "createdAt": "x"}}});
        let mut copy = message.clone();
        assert!(!seal(&mut copy, &a, &ANON, &mut |_| {}).unwrap());
        assert_eq!(copy, message);
    }

    /// Tasks extension, "Error Handling": an unknown task id is -32602; here it never reaches
    /// the MCP server.
    #[test]
    fn requests_naming_a_task_get_the_servers_id_or_a_miss() {
        let (a, b) = (ids("a"), ids("b"));
        let sealed = a.mint("t-1", &ANON).unwrap();
        let mut get =
            json!({"jsonrpc": "2.0", "id": 5, "method": "tasks/get", "params": {"taskId": sealed}});
        let opened = open(&mut get, &a, a.home(), Revision::Extension, &ANON)
            .unwrap()
            .unwrap();
        assert_eq!(opened.upstream, "t-1");
        assert_eq!(get["params"]["taskId"], "t-1");
        let mut elsewhere = json!({"jsonrpc": "2.0", "id": 6, "method": "tasks/cancel", "params": {"taskId": sealed}});
        assert_eq!(
            open(&mut elsewhere, &b, b.home(), Revision::Extension, &ANON),
            Err(TaskMiss::Gone)
        );
        for forged in [json!("t-1"), json!(7), json!(format!("{sealed}x"))] {
            let mut get = json!({"jsonrpc": "2.0", "id": 7, "method": "tasks/get", "params": {"taskId": forged}});
            assert_eq!(
                open(&mut get, &a, a.home(), Revision::Extension, &ANON),
                Err(TaskMiss::Unknown)
            );
        }
        let mut missing = json!({"jsonrpc": "2.0", "id": 8, "method": "tasks/get", "params": {}});
        assert_eq!(
            open(&mut missing, &a, a.home(), Revision::Extension, &ANON),
            Err(TaskMiss::Unknown)
        );
        // `tasks/result` is a 2025-11-25 method: in 2026-07-28 it names nothing (-32601 is the
        // MCP server's to answer).
        let mut result = json!({"jsonrpc": "2.0", "id": 10, "method": "tasks/result", "params": {"taskId": "t-1"}});
        assert_eq!(
            open(&mut result, &a, a.home(), Revision::Extension, &ANON),
            Ok(None)
        );
        assert_eq!(
            open(&mut result, &a, a.home(), Revision::Session, &ANON),
            Err(TaskMiss::Unknown)
        );
        let mut other =
            json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "x"}});
        assert_eq!(
            open(&mut other, &a, a.home(), Revision::Extension, &ANON),
            Ok(None)
        );
    }

    #[test]
    fn a_clients_answer_within_a_task_names_the_servers_id() {
        let a = ids("a");
        let sealed = a.mint("t-1", &ANON).unwrap();
        let mut answer = json!({"jsonrpc": "2.0", "id": 1, "result": {"action": "accept",
            "_meta": {RELATED_TASK: {"taskId": sealed}}}});
        assert_eq!(
            open(&mut answer, &a, a.home(), Revision::Extension, &ANON),
            Ok(None)
        );
        assert_eq!(answer["result"]["_meta"][RELATED_TASK]["taskId"], "t-1");
    }

    #[test]
    fn the_holder_is_read_from_a_genuine_mcp_name_only() {
        let a = ids("a");
        let sealed = a.mint("t-1", &ANON).unwrap();
        assert_eq!(
            holder(&ids("b"), &sealed, &ANON),
            Some(HomeToken::for_pod("a"))
        );
        assert_eq!(holder(&a, "t-1", &ANON), None);
    }
}
