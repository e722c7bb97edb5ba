//! The 2026-07-28 clients of a rollout, beside the sessions (a dual-era endpoint): stateless
//! requests entering any pod of the Service, tasks polled wherever the next poll enters, and
//! `subscriptions/listen` streams listened to again when a drain ends them.
//!
//! Each client loops until the rollout is done: a `slow` call (which must answer `done
//! <count>`: anything else is a request cut), a `confirm` call (a multi round-trip request:
//! its retry enters another pod than its first round, and each pod's server has its own
//! request-state key), then a `job` task (tasks extension) polled every 200 ms at a random
//! entry until it is terminal (a -32602 is a task-not-found answer). Each
//! listener keeps a `subscriptions/listen` stream open; a clean end (a drain's) is followed by a
//! new listen at a random entry, a broken one is counted as cut.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::BodyExt as _;
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::RolloutConfig;
use super::clients::ISSUER;
use crate::auth::{Issuer, Refresh, Tokens};
use crate::client::{ACCEPT_BOTH, McpClient, result_text};
use crate::modern::{self, get_task, request, send};

/// How often a task is polled.
const POLL_INTERVAL: Duration = Duration::from_millis(200);
/// How long a `job` task runs, in ms.
const JOB_MS: u64 = 1_000;
/// Polls of one task before the client gives up on it.
const MAX_POLLS: u32 = 300;
/// Times a `confirm` call is started over after its retry was refused.
const MRTR_ATTEMPTS: u32 = 3;

/// What the 2026-07-28 clients experienced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModernFigures {
    /// Clients (and listeners) that ran.
    pub clients: usize,
    /// Requests sent: calls, task creations, polls, listens.
    pub requests: u64,
    /// `slow` calls made.
    pub slow_calls: u64,
    /// Requests that got no proper answer: an error status, a JSON-RPC error other than a
    /// task's not-found, or a call's answer other than its result.
    pub cut: u64,
    /// `subscriptions/listen` streams opened.
    pub listens: u64,
    /// Listen streams opened again after a drain ended one cleanly.
    pub listens_reestablished: u64,
    /// Listen streams that ended cleanly with their request's completion result (the spec's
    /// graceful closure), of those that ended cleanly.
    pub listens_completed: u64,
    /// Listen streams that broke off instead of ending cleanly.
    pub listens_cut: u64,
    /// `confirm` calls (multi round-trip requests) that completed.
    pub mrtr_calls: u64,
    /// Of their retries, those that entered another pod than their first round.
    pub mrtr_across_pods: u64,
    /// Retries whose state the server refused (the pod that issued it was gone): the client
    /// started the call over, as the spec has it.
    pub mrtr_started_over: u64,
    /// Tasks created.
    pub tasks: u64,
    /// Tasks polled at least once entering a pod other than the one that created them.
    pub tasks_across_pods: u64,
    /// Answers -32602 (task not found) to a poll of a task the client holds.
    pub task_not_found: u64,
    /// The first failures, described.
    pub failures: Vec<String>,
}

impl ModernFigures {
    fn add(&mut self, other: Self) {
        self.clients += other.clients;
        self.requests += other.requests;
        self.slow_calls += other.slow_calls;
        self.cut += other.cut;
        self.listens += other.listens;
        self.listens_reestablished += other.listens_reestablished;
        self.listens_completed += other.listens_completed;
        self.listens_cut += other.listens_cut;
        self.mrtr_calls += other.mrtr_calls;
        self.mrtr_across_pods += other.mrtr_across_pods;
        self.mrtr_started_over += other.mrtr_started_over;
        self.tasks += other.tasks;
        self.tasks_across_pods += other.tasks_across_pods;
        self.task_not_found += other.task_not_found;
        self.failures.extend(other.failures);
        self.failures.truncate(20);
    }

    fn fail(&mut self, what: String) {
        self.cut += 1;
        if self.failures.len() < 20 {
            self.failures.push(what);
        }
    }

    /// Whether nothing was cut and every task was found.
    pub fn is_clean(&self) -> bool {
        self.cut == 0 && self.listens_cut == 0 && self.task_not_found == 0
    }
}

/// The running clients.
pub(super) struct ModernLoad {
    tasks: JoinSet<ModernFigures>,
    done: watch::Sender<bool>,
}

impl ModernLoad {
    /// Starts `cfg.modern_clients` clients and `cfg.listeners` listeners of `client`'s
    /// endpoint, with their own tokens of `issuer` when `cfg.auth` is set.
    pub(super) fn start(
        client: &McpClient,
        cfg: &RolloutConfig,
        issuer: Option<&Arc<Issuer>>,
    ) -> Self {
        let (done, _) = watch::channel(false);
        let mut tasks = JoinSet::new();
        let user = |sub: String| match (&cfg.auth, issuer) {
            (Some(auth), Some(issuer)) => client.clone().with_tokens(Tokens::new(
                Arc::clone(issuer),
                ISSUER,
                &sub,
                auth.token_ttl,
                Refresh::BeforeExpiry,
            )),
            _ => client.clone(),
        };
        for index in 0..cfg.modern_clients {
            let worker = Worker {
                client: user(format!("modern-{index}")),
                index,
                count: cfg.count,
                interval_ms: cfg.interval_ms,
                done: done.subscribe(),
            };
            tasks.spawn(worker.calls());
        }
        for index in 0..cfg.listeners {
            let worker = Worker {
                client: user(format!("listener-{index}")),
                index,
                count: 0,
                interval_ms: 0,
                done: done.subscribe(),
            };
            tasks.spawn(worker.listen());
        }
        Self { tasks, done }
    }

    /// Tells the clients the rollout is done and waits (at most `within`) for them.
    pub(super) async fn finish(mut self, within: Duration) -> ModernFigures {
        self.done.send_replace(true);
        let mut figures = ModernFigures::default();
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.tasks.join_next()).await {
                Ok(Some(Ok(f))) => figures.add(f),
                Ok(Some(Err(e))) => figures.fail(format!("harness: 2026-07-28 client failed: {e}")),
                Ok(None) => break,
                Err(_) => {
                    figures.fail(format!(
                        "harness: {} 2026-07-28 clients still running {within:?} after the rollout",
                        self.tasks.len()
                    ));
                    self.tasks.abort_all();
                    break;
                }
            }
        }
        figures
    }
}

/// Whether the last event of listen stream bytes `tail` is the completion result of listen
/// request 1 (`resultType` `complete`).
fn ends_with_completion(tail: &[u8]) -> bool {
    let text = String::from_utf8_lossy(tail).replace("\r\n", "\n");
    let last = text
        .split("\n\n")
        .filter_map(|event| event.lines().find_map(|l| l.strip_prefix("data:")))
        .last();
    last.and_then(|data| serde_json::from_str::<serde_json::Value>(data.trim()).ok())
        .is_some_and(|m| m["id"] == 1 && m["result"]["resultType"] == "complete")
}

/// One 2026-07-28 client or listener.
struct Worker {
    client: McpClient,
    index: usize,
    count: u32,
    interval_ms: u64,
    done: watch::Receiver<bool>,
}

impl Worker {
    fn done(&self) -> bool {
        *self.done.borrow()
    }

    /// Calls and tasks until the rollout is done (at least one of each).
    async fn calls(self) -> ModernFigures {
        let mut f = ModernFigures {
            clients: 1,
            ..ModernFigures::default()
        };
        let mut round = 0u64;
        loop {
            round += 1;
            self.slow_call(round, &mut f).await;
            self.confirm(round, &mut f).await;
            self.task(round, &mut f).await;
            if self.done() {
                return f;
            }
        }
    }

    async fn slow_call(&self, round: u64, f: &mut ModernFigures) {
        let call_id = format!("modern-{}-{round}", self.index);
        let params = json!({"name": "slow", "arguments": {
            "count": self.count, "interval_ms": self.interval_ms, "call_id": call_id}});
        f.requests += 1;
        f.slow_calls += 1;
        let url = self.client.entry();
        let expected = format!("done {}", self.count);
        match request(
            &self.client,
            &url,
            round,
            "tools/call",
            Some("slow"),
            params,
        )
        .await
        {
            Ok((StatusCode::OK, answer)) if result_text(&answer) == Some(expected.as_str()) => {}
            Ok((status, answer)) => f.fail(format!("slow {call_id} at {url}: {status} {answer}")),
            Err(e) => f.fail(format!("slow {call_id} at {url}: {e}")),
        }
    }

    /// A `confirm` call: its first round, then its retry (another request id) entering another
    /// pod when it can; a retry the server refuses starts the call over (at most 3 times).
    async fn confirm(&self, round: u64, f: &mut ModernFigures) {
        let call_id = format!("modern-confirm-{}-{round}", self.index);
        let mut meta = modern::meta(false);
        meta["io.modelcontextprotocol/clientCapabilities"] = json!({"elicitation": {"form": {}}});
        for _attempt in 0..MRTR_ATTEMPTS {
            let first_at = self.client.entry();
            let params = json!({"name": "confirm", "arguments": {"call_id": call_id},
                "_meta": meta});
            f.requests += 1;
            let state = match send(
                &self.client,
                &first_at,
                round,
                "tools/call",
                Some("confirm"),
                params,
            )
            .await
            {
                Ok((StatusCode::OK, answer))
                    if answer["result"]["resultType"] == "input_required" =>
                {
                    answer["result"]["requestState"].clone()
                }
                Ok((status, answer)) => {
                    return f.fail(format!(
                        "confirm {call_id} at {first_at}: {status} {answer}"
                    ));
                }
                Err(e) => return f.fail(format!("confirm {call_id} at {first_at}: {e}")),
            };
            let mut retry_at = self.client.entry();
            for _ in 0..4 {
                if retry_at != first_at {
                    break;
                }
                retry_at = self.client.entry();
            }
            let params = json!({"name": "confirm", "arguments": {"call_id": call_id},
                "inputResponses": {"confirm": {"action": "accept", "content": {"ok": true}}},
                "requestState": state, "_meta": meta});
            f.requests += 1;
            let expected = format!("confirmed {call_id}: accept");
            match send(
                &self.client,
                &retry_at,
                round + 1_000_000,
                "tools/call",
                Some("confirm"),
                params,
            )
            .await
            {
                Ok((StatusCode::OK, answer)) if result_text(&answer) == Some(expected.as_str()) => {
                    f.mrtr_calls += 1;
                    f.mrtr_across_pods += u64::from(retry_at != first_at);
                    return;
                }
                Ok((StatusCode::OK, answer))
                    if answer["error"]["data"]["reason"] == "request_state_rejected" =>
                {
                    f.mrtr_started_over += 1;
                }
                Ok((status, answer)) => {
                    return f.fail(format!(
                        "confirm {call_id} retry at {retry_at}: {status} {answer}"
                    ));
                }
                Err(e) => return f.fail(format!("confirm {call_id} retry at {retry_at}: {e}")),
            }
        }
        f.fail(format!("confirm {call_id}: refused {MRTR_ATTEMPTS} times"));
    }

    async fn task(&self, round: u64, f: &mut ModernFigures) {
        let call_id = format!("modern-task-{}-{round}", self.index);
        let params = json!({"name": "job", "arguments": {"ms": JOB_MS, "call_id": call_id}});
        let created_at = self.client.entry();
        f.requests += 1;
        let task_id = match request(
            &self.client,
            &created_at,
            round,
            "tools/call",
            Some("job"),
            params,
        )
        .await
        {
            Ok((StatusCode::OK, answer)) if answer["result"]["resultType"] == "task" => {
                answer["result"]["taskId"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            }
            Ok((status, answer)) => {
                return f.fail(format!("job {call_id} at {created_at}: {status} {answer}"));
            }
            Err(e) => return f.fail(format!("job {call_id} at {created_at}: {e}")),
        };
        f.tasks += 1;
        let mut across = false;
        for poll in 0..MAX_POLLS {
            tokio::time::sleep(POLL_INTERVAL).await;
            let url = self.client.entry();
            across |= url != created_at;
            f.requests += 1;
            let answer = match get_task(&self.client, &url, u64::from(poll), &task_id).await {
                Ok((StatusCode::OK, answer)) => answer,
                Ok((status, answer)) => {
                    f.fail(format!("tasks/get {call_id} at {url}: {status} {answer}"));
                    continue;
                }
                Err(e) => {
                    f.fail(format!("tasks/get {call_id} at {url}: {e}"));
                    continue;
                }
            };
            if answer["error"]["code"] == -32602 {
                f.task_not_found += 1;
                f.failures
                    .push(format!("task {call_id} not found at {url}: {answer}"));
                return;
            }
            match answer["result"]["status"].as_str() {
                Some("working") => {}
                Some("completed") => {
                    f.tasks_across_pods += u64::from(across);
                    return;
                }
                _ => return f.fail(format!("tasks/get {call_id} at {url}: {answer}")),
            }
        }
        f.fail(format!(
            "task {call_id} still working after {MAX_POLLS} polls"
        ));
    }

    /// Listens until the rollout is done, again after each clean end.
    async fn listen(mut self) -> ModernFigures {
        let mut f = ModernFigures {
            clients: 1,
            ..ModernFigures::default()
        };
        let mut ended_cleanly = false;
        while !self.done() {
            let url = self.client.entry();
            let body = json!({"jsonrpc": "2.0", "id": 1, "method": "subscriptions/listen",
                "params": {"notifications": {"toolsListChanged": true}, "_meta": modern::meta(false)}});
            let headers = [
                ("accept", ACCEPT_BOTH),
                ("content-type", "application/json"),
                ("mcp-protocol-version", modern::VERSION),
                ("mcp-method", "subscriptions/listen"),
            ];
            f.requests += 1;
            let sent = self
                .client
                .send_at(
                    &url,
                    Method::POST,
                    &headers,
                    Some(Bytes::from(body.to_string())),
                )
                .await;
            let resp = match sent {
                Ok(resp) if resp.status() == StatusCode::OK => resp,
                Ok(resp) => {
                    f.fail(format!("listen at {url}: {}", resp.status()));
                    tokio::time::sleep(POLL_INTERVAL).await;
                    continue;
                }
                Err(e) => {
                    f.fail(format!("listen at {url}: {e}"));
                    tokio::time::sleep(POLL_INTERVAL).await;
                    continue;
                }
            };
            f.listens += 1;
            f.listens_reestablished += u64::from(ended_cleanly);
            let mut body = resp.into_body();
            // The stream's last bytes, where a clean end's completion result is.
            let mut tail = Vec::new();
            ended_cleanly = loop {
                tokio::select! {
                    frame = body.frame() => match frame {
                        Some(Ok(frame)) => {
                            if let Some(data) = frame.data_ref() {
                                tail.extend_from_slice(data);
                                let excess = tail.len().saturating_sub(4_096);
                                tail.drain(..excess);
                            }
                        }
                        None => {
                            f.listens_completed += u64::from(ends_with_completion(&tail));
                            break true;
                        }
                        Some(Err(e)) => {
                            f.listens_cut += 1;
                            f.failures.push(format!("listen {} at {url} broke: {e}", self.index));
                            break false;
                        }
                    },
                    _ = self.done.changed() => return f,
                }
            };
        }
        f
    }
}
