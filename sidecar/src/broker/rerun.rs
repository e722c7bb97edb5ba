//! Whether a request may run a second time without harm (`docs/design/replication.md#write-ahead`):
//! a request that may not waits for its retry record to be kept at the replica pod before it is
//! dispatched (the write-ahead); one that may is dispatched at once, and after a loss of its
//! holder its client's retry may run it again, which changes nothing.
//!
//! Harmless are the methods that change nothing at the MCP server ([`HARMLESS_METHODS`]: reads,
//! lists, `ping`, subscriptions and the log level, which are idempotent) and the calls of tools
//! the MCP server declares read-only in its `tools/list` answers (`annotations.readOnlyHint:
//! true`: the tool does not modify its environment). `idempotentHint` is not enough: the retry
//! comes a second or more after the first run, after a failover, and running `set(x, 1)` again
//! then may undo what another session wrote meanwhile. Every other request, a call of a tool
//! never listed or of a method this sidecar does not know included, is harmful.
//!
//! The MCP server is the one the endpoint fronts, so its annotations are trusted: a tool that
//! claims to be read-only and is not can only be run twice by its own server. The tools are
//! known per pod, by name: a server whose tool of one name is read-only in one session and not
//! in another must not declare it read-only. A tool stays harmless while every listing that names
//! it declares it so; one listing that does not makes it harmful until the sidecar restarts. A
//! `notifications/tools/list_changed` from the server forgets the harmless ones (until the next
//! listing). Learning follows the answer: a call sent while its listing's answer is being read is
//! classified as before it. At most `--write-ahead-max-tools` tools are remembered (counted in
//! `tether_write_ahead_tools`); a tool beyond is harmful.

use std::collections::HashMap;

use parking_lot::Mutex;
use serde_json::Value;

use super::Broker;
use crate::mcp::jsonrpc::Message;
use crate::mcp::methods::{
    LOGGING_SET_LEVEL, PING, RESOURCES_SUBSCRIBE, RESOURCES_UNSUBSCRIBE, TASKS_CANCEL, TASKS_GET,
    TASKS_RESULT, TOOLS_CALL, TOOLS_LIST,
};

/// Methods a second dispatch of which changes nothing at the MCP server.
const HARMLESS_METHODS: [&str; 14] = [
    PING,
    TOOLS_LIST,
    "prompts/list",
    "prompts/get",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    RESOURCES_SUBSCRIBE,
    RESOURCES_UNSUBSCRIBE,
    "completion/complete",
    LOGGING_SET_LEVEL,
    TASKS_GET,
    TASKS_RESULT,
    TASKS_CANCEL,
];

/// Longest tool name remembered, in bytes (the spec's names are at most 128 characters).
const MAX_TOOL_NAME: usize = 128;

/// What a second dispatch of a request would do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rerun {
    /// It may change something at the MCP server: the request waits for the write-ahead.
    Harmful,
    /// It changes nothing.
    Harmless,
    /// A `tools/list`: harmless, and its answer tells which tools are.
    Lists,
}

/// What a second dispatch of a request of `method` would do; `tool` is a `tools/call`'s
/// `params.name`, `harmless` whether the MCP server declared a tool harmless.
pub(crate) fn rerun(method: &str, tool: Option<&str>, harmless: impl Fn(&str) -> bool) -> Rerun {
    match method {
        TOOLS_LIST => Rerun::Lists,
        TOOLS_CALL if tool.is_some_and(harmless) => Rerun::Harmless,
        TOOLS_CALL => Rerun::Harmful,
        m if HARMLESS_METHODS.contains(&m) => Rerun::Harmless,
        _ => Rerun::Harmful,
    }
}

/// The tools a `tools/list` answer declares, each with whether a second call is harmless.
fn declared(answer: &Value) -> impl Iterator<Item = (&str, bool)> {
    answer["result"]["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|tool| {
            let name = tool["name"].as_str()?;
            let hints = &tool["annotations"];
            let harmless = hints["readOnlyHint"] == true;
            Some((name, harmless))
        })
}

/// The tools the MCP server declared, and whether each is harmless to call again.
#[derive(Debug)]
pub(crate) struct Tools {
    known: Mutex<HashMap<Box<str>, bool>>,
    max: usize,
}

impl Tools {
    /// Remembers at most `max` tools.
    pub(crate) fn new(max: usize) -> Self {
        Self {
            known: Mutex::new(HashMap::new()),
            max,
        }
    }

    /// Whether tool `name` was declared harmless by every listing that named it.
    pub(crate) fn harmless(&self, name: &str) -> bool {
        self.known.lock().get(name).copied().unwrap_or(false)
    }

    /// Learns from `answer`, the body of a `tools/list` answer (not one: nothing is learnt);
    /// returns how many known tools are harmless and harmful now.
    pub(crate) fn learn(&self, answer: &[u8]) -> (usize, usize) {
        let answer: Value = serde_json::from_slice(answer).unwrap_or_default();
        let mut known = self.known.lock();
        for (name, harmless) in declared(&answer) {
            if let Some(was) = known.get_mut(name) {
                *was &= harmless;
            } else if known.len() < self.max && name.len() <= MAX_TOOL_NAME {
                known.insert(name.into(), harmless);
            }
        }
        count(&known)
    }

    /// Forgets the tools declared harmless (the server said its tools changed); returns the
    /// counts as [`Tools::learn`] does.
    pub(crate) fn forget_harmless(&self) -> (usize, usize) {
        let mut known = self.known.lock();
        known.retain(|_, harmless| !*harmless);
        count(&known)
    }
}

/// The known tools that are harmless and harmful.
fn count(known: &HashMap<Box<str>, bool>) -> (usize, usize) {
    let harmless = known.values().filter(|h| **h).count();
    (harmless, known.len() - harmless)
}

/// Whether upstream message `data` may be a `notifications/tools/list_changed` (a cheap search:
/// a false positive only forgets what the next listing teaches again).
pub(crate) fn may_change_tools(data: &[u8]) -> bool {
    static LIST_CHANGED: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| {
            memchr::memmem::Finder::new(b"notifications/tools/list_changed")
        });
    LIST_CHANGED.find(data).is_some()
}

impl Broker {
    /// What a second dispatch of `message` (its JSON `json`) would do.
    pub(super) fn rerun_of(&self, message: &Message, json: &Value) -> Rerun {
        match message {
            Message::Request { method, .. } => {
                rerun(method, json["params"]["name"].as_str(), |t| {
                    self.tools.harmless(t)
                })
            }
            Message::Notification { .. } | Message::Response => Rerun::Harmless,
        }
    }

    /// Learns from `answer`, the body of a `tools/list` answer, which tools are harmless.
    pub(super) fn learn_tools(&self, answer: &[u8]) {
        let (harmless, harmful) = self.tools.learn(answer);
        self.metrics.write_ahead_tools(harmless, harmful);
    }

    /// Forgets the harmless tools when upstream message `data` says the tools changed.
    pub(super) fn watch_tools(&self, data: &[u8]) {
        if may_change_tools(data) {
            let (harmless, harmful) = self.tools.forget_harmless();
            self.metrics.write_ahead_tools(harmless, harmful);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_request_is_harmless_to_run_again_only_when_its_method_or_tool_says_so() {
        let harmless = |name: &str| name == "search";
        // (method, tool) → what a second dispatch does
        let table = [
            ("tools/call", Some("search"), Rerun::Harmless),
            ("tools/call", Some("delete"), Rerun::Harmful),
            ("tools/call", None, Rerun::Harmful),
            ("tools/list", None, Rerun::Lists),
            ("resources/read", None, Rerun::Harmless),
            ("ping", None, Rerun::Harmless),
            ("tasks/cancel", None, Rerun::Harmless),
            ("tasks/update", None, Rerun::Harmful),
            ("x-vendor/launch", None, Rerun::Harmful),
        ];
        for (method, tool, want) in table {
            assert_eq!(rerun(method, tool, harmless), want, "{method} {tool:?}");
        }
    }

    fn listing(tools: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": 1, "result": {"tools": tools}})).unwrap()
    }

    #[test]
    fn a_tool_is_harmless_while_every_listing_declares_it_read_only() {
        let tools = Tools::new(8);
        let first = listing(json!([
            {"name": "search", "annotations": {"readOnlyHint": true}},
            {"name": "lookup", "annotations": {"readOnlyHint": true, "idempotentHint": true}},
            {"name": "upsert", "annotations": {"readOnlyHint": false, "idempotentHint": true}},
            {"name": "delete", "annotations": {"destructiveHint": true}},
            {"name": "plain"},
            {"name": "liar", "annotations": {"readOnlyHint": "yes"}},
        ]));
        assert_eq!(tools.learn(&first), (2, 4));
        assert!(tools.harmless("search") && tools.harmless("lookup"));
        assert!(!tools.harmless("upsert") && !tools.harmless("delete"));
        assert!(!tools.harmless("plain") && !tools.harmless("liar"));
        assert!(!tools.harmless("never-listed"));
        // A later listing that does not declare it harmless makes it harmful for good; one
        // that declares a harmful tool harmless does not change it.
        let second = listing(json!([
            {"name": "search"},
            {"name": "delete", "annotations": {"readOnlyHint": true}},
        ]));
        assert_eq!(tools.learn(&second), (1, 5));
        assert!(!tools.harmless("search") && !tools.harmless("delete"));
        assert!(tools.harmless("lookup"));
        // The server said its tools changed: the harmless ones wait for the next listing.
        let changed = br#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#;
        assert!(may_change_tools(changed));
        assert!(!may_change_tools(
            br#"{"jsonrpc":"2.0","method":"notifications/progress"}"#
        ));
        assert_eq!(tools.forget_harmless(), (0, 5));
        assert!(!tools.harmless("lookup"));
        assert_eq!(
            tools.learn(&first),
            (1, 5),
            "lookup again; search stays harmful"
        );
    }

    #[test]
    fn what_is_not_a_listing_teaches_nothing_and_the_bound_holds() {
        let tools = Tools::new(2);
        assert_eq!(tools.learn(b"not json"), (0, 0));
        assert_eq!(
            tools.learn(br#"{"jsonrpc":"2.0","id":1,"error":{"code":1}}"#),
            (0, 0)
        );
        let long = "x".repeat(MAX_TOOL_NAME + 1);
        let many = listing(json!([
            {"name": long, "annotations": {"readOnlyHint": true}},
            {"name": "a", "annotations": {"readOnlyHint": true}},
            {"name": "b", "annotations": {"readOnlyHint": true}},
            {"name": "c", "annotations": {"readOnlyHint": true}},
        ]));
        assert_eq!(tools.learn(&many), (2, 0));
        assert!(tools.harmless("a") && tools.harmless("b"));
        assert!(!tools.harmless("c") && !tools.harmless(&long));
    }
}
