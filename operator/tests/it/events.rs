//! The operator's Events against the in-memory API server ([`crate::support`]): what a cluster gets
//! for a note over the API server's limit, for two notes with one reason, and for a repeat.

use crate::support::{Shared, api_with, client_of};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{EventType, Reporter};
use serde_json::Value;
use tether_operator::events::{Events, NOTE_LIMIT};

const EVENTS_PATH: &str = "/apis/events.k8s.io/v1/namespaces/tools/events";

fn endpoint() -> ObjectReference {
    ObjectReference {
        api_version: Some("mcp.tether.dev/v1alpha1".into()),
        kind: Some("McpEndpoint".into()),
        name: Some("weather".into()),
        namespace: Some("tools".into()),
        uid: Some("e-1".into()),
        ..ObjectReference::default()
    }
}

fn events_of(api: &Shared) -> Events {
    let reporter = Reporter {
        controller: "tether-operator".into(),
        instance: Some("tether-0".into()),
    };
    Events::new(client_of(api, "tools"), reporter)
}

/// The Event writes so far, as `(method, note, series count)`.
fn event_writes(api: &Shared) -> Vec<(String, String, Option<i64>)> {
    let a = api.lock().unwrap();
    assert_eq!(a.forbidden, Vec::<String>::new(), "outside the RBAC rules");
    a.writes
        .iter()
        .filter(|w| w.path.starts_with(EVENTS_PATH))
        .map(|w| {
            let note = w.body["note"].as_str().unwrap_or_default().to_owned();
            let count = w.body["series"]["count"].as_i64();
            (w.method.to_string(), note, count)
        })
        .collect()
}

#[tokio::test]
async fn a_note_over_the_limit_arrives_cut_to_it() {
    let api = api_with(&[]);
    let events = events_of(&api);
    let long = format!(
        "invalid spec: {}",
        "spec.origins.allow[7]: not an origin; ".repeat(40)
    );
    assert!(long.len() > 1500);
    events
        .publish(&endpoint(), EventType::Warning, "InvalidSpec", &long)
        .await
        .unwrap();
    let writes = event_writes(&api);
    assert_eq!(writes.len(), 1, "{writes:?}");
    let (method, note, _) = &writes[0];
    assert_eq!(method, "POST");
    assert!(note.len() <= NOTE_LIMIT, "{} bytes", note.len());
    assert!(note.ends_with('…'));
    assert!(long.starts_with(note.trim_end_matches('…')));
}

#[tokio::test]
async fn two_notes_with_one_reason_are_two_events_and_a_repeat_is_a_series() {
    let api = api_with(&[]);
    let events = events_of(&api);
    let first = "applied ConfigMap/weather-tether";
    let second = "applied Deployment/weather; the pod template changed, so the pods are replaced";
    for note in [first, second, first] {
        events
            .publish(&endpoint(), EventType::Normal, "Applied", note)
            .await
            .unwrap();
    }
    let writes = event_writes(&api);
    assert_eq!(
        writes,
        [
            ("POST".to_owned(), first.to_owned(), None),
            ("POST".to_owned(), second.to_owned(), None),
            ("PATCH".to_owned(), first.to_owned(), Some(2)),
        ]
    );
    // Two Events are stored, each with its own note; the repeat patched the first.
    let a = api.lock().unwrap();
    let stored: Vec<&Value> = a
        .objects
        .iter()
        .filter(|(path, _)| path.starts_with(EVENTS_PATH))
        .map(|(_, v)| v)
        .collect();
    assert_eq!(stored.len(), 2, "{stored:?}");
    let patched = &a.writes[2];
    let first_name = a.writes[0].body["metadata"]["name"].as_str().unwrap();
    assert_eq!(patched.path, format!("{EVENTS_PATH}/{first_name}"));
}
