//! MCP's method names, as the sidecar reads and writes them: one home for the vocabulary the
//! broker, the journal, the task rules and the 2026-07-28 rules share (spec: `basic/lifecycle`,
//! `server/tools`, `server/resources`, `server/utilities/logging`, the tasks extension,
//! `subscriptions/listen` of 2026-07-28).

/// The request that opens a session.
pub(crate) const INITIALIZE: &str = "initialize";
/// The notification that completes a session's initialization.
pub(crate) const INITIALIZED: &str = "notifications/initialized";
/// The notification that cancels a request (spec L-02).
pub(crate) const CANCELLED: &str = "notifications/cancelled";
/// The liveness request either side may send.
pub(crate) const PING: &str = "ping";
/// A tool call.
pub(crate) const TOOLS_CALL: &str = "tools/call";
/// The tools' list (whose answers declare each tool's annotations).
pub(crate) const TOOLS_LIST: &str = "tools/list";
/// The log level a client sets for its session.
pub(crate) const LOGGING_SET_LEVEL: &str = "logging/setLevel";
/// A subscription to a resource's updates.
pub(crate) const RESOURCES_SUBSCRIBE: &str = "resources/subscribe";
/// The end of a subscription to a resource's updates.
pub(crate) const RESOURCES_UNSUBSCRIBE: &str = "resources/unsubscribe";
/// The 2026-07-28 stream of server notifications a client opens (SEP-2575, replacing the
/// standalone GET stream).
pub(crate) const LISTEN: &str = "subscriptions/listen";
/// A task's state.
pub(crate) const TASKS_GET: &str = "tasks/get";
/// A change to a task's input.
pub(crate) const TASKS_UPDATE: &str = "tasks/update";
/// A task's cancellation.
pub(crate) const TASKS_CANCEL: &str = "tasks/cancel";
/// A task's result (2025-era sessions only; removed in 2026-07-28).
pub(crate) const TASKS_RESULT: &str = "tasks/result";
/// The prefix of the notifications about tasks (`notifications/tasks/status`).
pub(crate) const TASK_NOTIFICATIONS: &str = "notifications/tasks/";
