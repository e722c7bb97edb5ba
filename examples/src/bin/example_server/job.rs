//! The `job` tool and the server's tasks (the tasks extension, SEP-2663, on rmcp's
//! [`TaskManager`]): a call from a client that declares the extension returns a task at once
//! (`CreateTaskResult`), polled with `tasks/get` and ended early with `tasks/cancel`; any other
//! call runs to its end. One task table per server process, shared by every session and
//! stateless request, as one pod's MCP server keeps its tasks.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rmcp::ErrorData;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::task_manager::{TaskExit, TaskManager, TaskOptions};
use serde::Deserialize;

use super::Stats;

/// How often a task's client is asked to poll, in ms.
const POLL_INTERVAL_MS: u64 = 100;
/// How long a finished task stays readable, in ms.
const TASK_TTL_MS: u64 = 600_000;

/// `job` arguments: run for `ms`, count the execution under `call_id`.
#[derive(Debug, Deserialize, rmcp::schemars::JsonSchema)]
pub(crate) struct JobArgs {
    pub(crate) ms: u64,
    pub(crate) call_id: String,
}

impl JobArgs {
    /// The arguments of a `tools/call` of `job`.
    pub(crate) fn parse(arguments: Option<&rmcp::model::JsonObject>) -> Result<Self, ErrorData> {
        serde_json::from_value(serde_json::Value::Object(
            arguments.cloned().unwrap_or_default(),
        ))
        .map_err(|e| ErrorData::invalid_params(e.to_string(), None))
    }
}

/// Runs `job` to its end: counted in `stats` like `slow` (executions per call id), then
/// `done <call_id>`.
pub(crate) async fn run(stats: &Stats, args: &JobArgs) -> String {
    stats.executed(&args.call_id);
    tokio::time::sleep(Duration::from_millis(args.ms)).await;
    stats.completed.fetch_add(1, Ordering::Relaxed);
    format!("done {}", args.call_id)
}

/// Starts `job` as a task of `tasks`; a `tasks/cancel` ends it (counted aborted).
pub(crate) fn spawn(tasks: &TaskManager, stats: Arc<Stats>, args: JobArgs) -> rmcp::model::Task {
    stats.tasks.fetch_add(1, Ordering::Relaxed);
    let options = TaskOptions::new()
        .with_poll_interval_ms(POLL_INTERVAL_MS)
        .with_ttl_ms(TASK_TTL_MS);
    tasks.spawn(options, move |ctx| {
        Box::pin(async move {
            tokio::select! {
                () = ctx.cancelled() => {
                    stats.aborted.fetch_add(1, Ordering::Relaxed);
                    Err(TaskExit::Cancelled)
                }
                text = run(&stats, &args) => {
                    Ok(CallToolResult::success(vec![ContentBlock::text(text)]))
                }
            }
        })
    })
}
