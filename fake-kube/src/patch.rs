//! JSON patches (RFC 6902), as the API server applies them.

use serde_json::Value;

/// `doc` after the JSON patch (RFC 6902) `ops`; as the API server, a `test` of `null` passes on
/// a missing path.
///
/// # Errors
/// Why an operation fails.
pub(crate) fn json_patch(doc: &Value, ops: &Value) -> Result<Value, String> {
    fn tokens(pointer: &str) -> Vec<String> {
        pointer
            .split('/')
            .skip(1)
            .map(|t| t.replace("~1", "/").replace("~0", "~"))
            .collect()
    }
    fn parent<'a>(doc: &'a mut Value, path: &[String]) -> Result<(&'a mut Value, String), String> {
        let (last, up) = path.split_last().ok_or("the root cannot be changed")?;
        let mut node = doc;
        for t in up {
            node = match node {
                Value::Object(m) => m.get_mut(t),
                Value::Array(a) => t.parse::<usize>().ok().and_then(|i| a.get_mut(i)),
                _ => None,
            }
            .ok_or_else(|| format!("missing path /{}", up.join("/")))?;
        }
        Ok((node, last.clone()))
    }
    let mut doc = doc.clone();
    for op in ops.as_array().ok_or("a JSON patch is a list")? {
        let path = tokens(op["path"].as_str().ok_or("an operation without path")?);
        match op["op"].as_str().unwrap_or_default() {
            "test" => {
                let found = doc.pointer(op["path"].as_str().unwrap_or_default());
                if found.unwrap_or(&Value::Null) != &op["value"] {
                    return Err(format!("testing value {} failed", op["path"]));
                }
            }
            "add" => match parent(&mut doc, &path)? {
                (Value::Object(m), key) => {
                    m.insert(key, op["value"].clone());
                }
                (Value::Array(a), key) if key == "-" => a.push(op["value"].clone()),
                (Value::Array(a), key) => {
                    let i: usize = key.parse().map_err(|_| format!("bad index {key}"))?;
                    if i > a.len() {
                        return Err(format!("index {i} out of range"));
                    }
                    a.insert(i, op["value"].clone());
                }
                _ => return Err("add to a value that is no object or list".to_owned()),
            },
            verb @ ("remove" | "replace") => {
                let (node, key) = parent(&mut doc, &path)?;
                let slot = match node {
                    Value::Object(m) => m.get_mut(&key),
                    Value::Array(a) => key.parse::<usize>().ok().and_then(|i| a.get_mut(i)),
                    _ => None,
                }
                .ok_or_else(|| format!("{verb}: missing path {}", op["path"]))?;
                if verb == "replace" {
                    *slot = op["value"].clone();
                } else {
                    match node {
                        Value::Object(m) => {
                            m.remove(&key);
                        }
                        Value::Array(a) => {
                            a.remove(key.parse::<usize>().unwrap_or_default());
                        }
                        _ => {}
                    }
                }
            }
            other => return Err(format!("unsupported operation {other:?}")),
        }
    }
    Ok(doc)
}
