//! Label selectors of list requests (`labelSelector`), in Kubernetes' syntax: requirements
//! joined by commas, each `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k` or `!k`.

use serde_json::Value;

/// One requirement of a selector.
enum Requirement {
    /// The label is one of these values (`=`, `==`, `in`).
    In(String, Vec<String>),
    /// The label is missing or none of these values (`!=`, `notin`).
    NotIn(String, Vec<String>),
    /// The label is set (`k`).
    Exists(String),
    /// The label is not set (`!k`).
    Missing(String),
}

/// The parsed `selector`.
///
/// # Errors
/// What does not parse, as the API server's 400 message says it.
fn parse(selector: &str) -> Result<Vec<Requirement>, String> {
    let mut parts = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in selector.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&selector[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&selector[start..]);
    let values = |list: &str| -> Result<Vec<String>, String> {
        let inner = list
            .trim()
            .strip_prefix('(')
            .and_then(|l| l.strip_suffix(')'))
            .ok_or_else(|| format!("unable to parse requirement: expected a list in {list:?}"))?;
        Ok(inner.split(',').map(|v| v.trim().to_owned()).collect())
    };
    let mut requirements = Vec::new();
    for part in parts.iter().map(|p| p.trim()).filter(|p| !p.is_empty()) {
        let requirement = if let Some((key, value)) = part.split_once("!=") {
            Requirement::NotIn(key.trim().to_owned(), vec![value.trim().to_owned()])
        } else if let Some((key, value)) = part.split_once("==").or_else(|| part.split_once('=')) {
            Requirement::In(key.trim().to_owned(), vec![value.trim().to_owned()])
        } else if let Some((key, list)) = part.split_once(" notin ") {
            Requirement::NotIn(key.trim().to_owned(), values(list)?)
        } else if let Some((key, list)) = part.split_once(" in ") {
            Requirement::In(key.trim().to_owned(), values(list)?)
        } else if let Some(key) = part.strip_prefix('!') {
            Requirement::Missing(key.trim().to_owned())
        } else if !part.contains(char::is_whitespace) {
            Requirement::Exists(part.to_owned())
        } else {
            return Err(format!("unable to parse requirement: {part:?}"));
        };
        requirements.push(requirement);
    }
    Ok(requirements)
}

/// Whether `obj`'s labels match `selector` (an empty selector matches everything).
///
/// # Errors
/// A selector that does not parse.
pub(super) fn matches(selector: &str, obj: &Value) -> Result<bool, String> {
    let labels = &obj["metadata"]["labels"];
    let label = |key: &str| labels[key].as_str();
    Ok(parse(selector)?.iter().all(|r| match r {
        Requirement::In(key, values) => label(key).is_some_and(|v| values.iter().any(|w| w == v)),
        Requirement::NotIn(key, values) => {
            !label(key).is_some_and(|v| values.iter().any(|w| w == v))
        }
        Requirement::Exists(key) => label(key).is_some(),
        Requirement::Missing(key) => label(key).is_none(),
    }))
}
