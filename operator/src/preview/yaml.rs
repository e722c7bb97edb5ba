//! Rendering a [`Preview`] as the YAML stream `tether-operator plan` prints: a document per
//! object written, a `#` comment on each saying what is done with it.

use serde_json::json;

use super::{Preview, Write};
use tether_crds::keyring::KEY_BYTES;

impl Preview {
    /// The preview as a YAML stream: each object written is a document (`---` between them)
    /// with a `#` comment saying what is done with it; unchanged objects are comments only.
    pub fn to_yaml(&self) -> String {
        let mut out = format!(
            "# tether-operator plan: McpEndpoint {} on Deployment {}: what one reconcile sends,\n\
             # in order. A preview, not for kubectl apply: the Secret's data is redacted and a\n\
             # deletion shows only what it deletes.\n",
            self.endpoint, self.target
        );
        let namespace = self.endpoint.split('/').next().unwrap_or_default();
        let mut documents = 0;
        for item in &self.items {
            let what = format!("{} {}", item.kind, item.name);
            let (comment, body) = match &item.write {
                Write::Unchanged => {
                    out.push_str(&format!(
                        "# unchanged {what}: the live object holds every field of the apply body; \
                         nothing is sent\n"
                    ));
                    continue;
                }
                Write::Apply(body) => (format!("apply {what} (server-side apply)"), body.clone()),
                Write::Create(body) => (
                    format!(
                        "create {what}; its data is redacted: the operator draws a random \
                         {KEY_BYTES}-byte key (hex) and a peer CA and certificate when it creates it"
                    ),
                    body.clone(),
                ),
                Write::Delete { uid, reason } => (
                    format!("delete {what} (only while its UID is {uid:?}): {reason}"),
                    json!({
                        "apiVersion": item.api_version,
                        "kind": item.kind,
                        "metadata": {"name": item.name, "namespace": namespace, "uid": uid},
                    }),
                ),
            };
            if documents > 0 {
                out.push_str("---\n");
            }
            documents += 1;
            out.push_str(&format!("# {comment}\n"));
            out.push_str(&yaml_serde::to_string(&body).expect("JSON serializes to YAML"));
        }
        if documents == 0 {
            out.push_str("# nothing to send\n");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize as _;
    use serde_json::{Value, json};

    use crate::preview::{Item, Preview, Write};

    #[test]
    fn the_yaml_has_a_document_per_write_and_a_comment_for_the_rest() {
        let item = |kind: &str, write: Write| Item {
            api_version: "v1".into(),
            kind: kind.into(),
            name: "weather-tether".into(),
            write,
        };
        let preview = Preview {
            endpoint: "tools/weather".into(),
            target: "weather".into(),
            items: vec![
                item("ConfigMap", Write::Unchanged),
                item(
                    "ConfigMap",
                    Write::Apply(json!({"kind": "ConfigMap", "data": {"a": "1"}})),
                ),
                item(
                    "ServiceAccount",
                    Write::Delete {
                        uid: Some("u-1".into()),
                        reason: "no pod runs with it".into(),
                    },
                ),
            ],
        };
        let yaml = preview.to_yaml();
        assert!(
            yaml.contains("# unchanged ConfigMap weather-tether:"),
            "{yaml}"
        );
        assert!(
            yaml.contains("# delete ServiceAccount weather-tether"),
            "{yaml}"
        );
        let documents: Vec<Value> = yaml_serde::Deserializer::from_str(&yaml)
            .map(|d| Value::deserialize(d).unwrap())
            .collect();
        assert_eq!(
            documents,
            [
                json!({"kind": "ConfigMap", "data": {"a": "1"}}),
                json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {
                    "name": "weather-tether", "namespace": "tools", "uid": "u-1"}}),
            ]
        );
        let nothing = Preview {
            items: vec![item("ConfigMap", Write::Unchanged)],
            ..preview
        };
        assert!(nothing.to_yaml().ends_with("# nothing to send\n"));
    }
}
