//! What the API server refuses to store (422 `Invalid`, a `Status` whose causes name the
//! fields): names that are not DNS-1123 subdomains (DNS-1035 labels for Services, path segments
//! for Roles and RoleBindings), a pod template without containers or with a container without
//! `image`, more than one owner reference with `controller: true`, and an `events.k8s.io/v1`
//! Event whose `note` is over 1,024 bytes.

use serde_json::{Value, json};

use super::failure;

/// Longest Event note, in bytes.
const NOTE_LIMIT: usize = 1024;

const SUBDOMAIN: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const DNS_1035: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";

/// One invalid field.
struct Cause {
    field: String,
    reason: &'static str,
    message: String,
}

impl Cause {
    fn invalid(field: &str, value: &Value, detail: &str) -> Self {
        Self {
            field: field.to_owned(),
            reason: "FieldValueInvalid",
            message: format!("Invalid value: {value}: {detail}"),
        }
    }
}

/// Checks `obj`, an object of `kind` in API `group` about to be stored.
///
/// # Errors
/// The 422 `Status` the API server answers.
pub(super) fn check(kind: &str, group: &str, obj: &Value) -> Result<(), Value> {
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    let mut causes = Vec::new();
    if let Some(detail) = name_problem(kind, name) {
        causes.push(Cause::invalid("metadata.name", &json!(name), &detail));
    }
    let controllers: Vec<String> = obj["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["controller"] == true)
        .map(|r| {
            format!(
                "{}/{}",
                r["kind"].as_str().unwrap_or_default(),
                r["name"].as_str().unwrap_or_default()
            )
        })
        .collect();
    if controllers.len() > 1 {
        let detail = format!(
            "Only one reference can have Controller set to true. Found \"true\" in references for {}",
            controllers.join(" and ")
        );
        causes.push(Cause::invalid(
            "metadata.ownerReferences",
            &obj["metadata"]["ownerReferences"],
            &detail,
        ));
    }
    let pod = match kind {
        "Deployment" => Some(("spec.template.spec", &obj["spec"]["template"]["spec"])),
        "Pod" => Some(("spec", &obj["spec"])),
        _ => None,
    };
    if let Some((at, spec)) = pod {
        pod_spec(at, spec, &mut causes);
    }
    if kind == "Event" && group == "events.k8s.io" {
        let note = obj["note"].as_str().unwrap_or_default();
        if note.len() > NOTE_LIMIT {
            causes.push(Cause {
                field: "note".to_owned(),
                reason: "FieldValueTooLong",
                message: format!("Too long: may not be more than {NOTE_LIMIT} bytes"),
            });
        }
    }
    if causes.is_empty() {
        return Ok(());
    }
    let printed: Vec<String> = causes
        .iter()
        .map(|c| format!("{}: {}", c.field, c.message))
        .collect();
    let qualified = if group.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind}.{group}")
    };
    let listed = match printed.as_slice() {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    };
    let causes: Vec<Value> = causes
        .iter()
        .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
        .collect();
    Err(failure(
        422,
        "Invalid",
        &format!("{qualified} {name:?} is invalid: {listed}"),
        json!({"name": name, "group": group, "kind": kind, "causes": causes}),
    ))
}

/// Checks that a write of `obj`, which was `live`, keeps what `immutable: true` freezes in a
/// Secret or ConfigMap: its data and the mark itself.
///
/// # Errors
/// The 422 `Status` the API server answers.
pub(super) fn frozen(kind: &str, live: &Value, obj: &Value) -> Result<(), Value> {
    if !matches!(kind, "Secret" | "ConfigMap") || live["immutable"] != true {
        return Ok(());
    }
    let changed: Vec<&str> = ["data", "binaryData", "immutable"]
        .into_iter()
        .filter(|f| live[*f] != obj[*f])
        .collect();
    let Some(first) = changed.first() else {
        return Ok(());
    };
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    let message = "Forbidden: field is immutable when `immutable` is set";
    let causes: Vec<Value> = changed
        .iter()
        .map(|f| json!({"reason": "FieldValueForbidden", "message": message, "field": f}))
        .collect();
    Err(failure(
        422,
        "Invalid",
        &format!("{kind} {name:?} is invalid: {first}: {message}"),
        json!({"name": name, "group": "", "kind": kind, "causes": causes}),
    ))
}

/// Why `name` is no valid name of a `kind`, if it is not.
fn name_problem(kind: &str, name: &str) -> Option<String> {
    match kind {
        "Service" if name.len() > 63 => Some("must be no more than 63 characters".to_owned()),
        "Service" => (!dns_1035_label(name)).then(|| DNS_1035.to_owned()),
        "Role" | "RoleBinding" => match name {
            "." | ".." => Some(format!("may not be '{name}'")),
            _ if name.contains(['/', '%']) => Some("may not contain '/' or '%'".to_owned()),
            _ => None,
        },
        _ if name.len() > 253 => Some("must be no more than 253 characters".to_owned()),
        _ => (!name.split('.').all(dns_1123_label)).then(|| SUBDOMAIN.to_owned()),
    }
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`
fn dns_1123_label(label: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = label.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(&first), Some(&last)) => {
            alnum(first) && alnum(last) && bytes.iter().all(|&b| alnum(b) || b == b'-')
        }
        _ => false,
    }
}

/// `[a-z]([-a-z0-9]*[a-z0-9])?`
fn dns_1035_label(label: &str) -> bool {
    dns_1123_label(label) && label.as_bytes()[0].is_ascii_lowercase()
}

/// The handler types of a probe or lifecycle hook.
const HANDLERS: [&str; 5] = ["exec", "httpGet", "tcpSocket", "grpc", "sleep"];

/// A pod spec (at field path `at`) has containers, each container an image, and each of its
/// probes and lifecycle hooks exactly one handler type.
fn pod_spec(at: &str, spec: &Value, causes: &mut Vec<Cause>) {
    if spec["containers"].as_array().is_none_or(Vec::is_empty) {
        causes.push(Cause {
            field: format!("{at}.containers"),
            reason: "FieldValueRequired",
            message: "Required value".to_owned(),
        });
    }
    for list in ["initContainers", "containers"] {
        for (i, c) in spec[list].as_array().into_iter().flatten().enumerate() {
            if c["image"].as_str().is_none_or(str::is_empty) {
                causes.push(Cause {
                    field: format!("{at}.{list}[{i}].image"),
                    reason: "FieldValueRequired",
                    message: "Required value".to_owned(),
                });
            }
            let hooks =
                ["preStop", "postStart"].map(|h| (format!("lifecycle.{h}"), &c["lifecycle"][h]));
            let probes =
                ["livenessProbe", "readinessProbe", "startupProbe"].map(|p| (p.to_owned(), &c[p]));
            for (name, handler) in hooks.into_iter().chain(probes) {
                let Some(handler) = handler.as_object() else {
                    continue;
                };
                if HANDLERS
                    .iter()
                    .filter(|h| handler.contains_key(**h))
                    .count()
                    > 1
                {
                    causes.push(Cause {
                        field: format!("{at}.{list}[{i}].{name}"),
                        reason: "FieldValueForbidden",
                        message: "Forbidden: may not specify more than 1 handler type".to_owned(),
                    });
                }
            }
        }
    }
}
