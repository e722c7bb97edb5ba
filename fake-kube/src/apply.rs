//! Server-side apply and the ownership of updates, as kubernetes-sigs/structured-merge-diff
//! computes them:
//!
//! - **apply** as manager M: the body merges into the live object; its field set becomes M's;
//!   a field M applied last time and no longer applies, and that no other manager owns, is
//!   removed (list items included, and a struct no other manager has fields in goes whole, with
//!   its defaults); a field whose value changes and that another manager owns is
//!   a conflict — the apply fails unless forced, and forcing moves the field to M. Applying the
//!   live value shares the field;
//! - **update** (create, patch, replace) as manager M: M owns every field its write added or
//!   changed, taken from the other managers without conflict; a removed field leaves every set.

use serde_json::{Value, json};

use super::failure;
use super::fields::{
    Changes, Entry, FieldSet, Path, compare, merge, remove, set_of, with_struct_fields,
};

/// A field another manager owns that an apply would change.
pub(super) struct Conflict {
    /// The owner, as the API server names it ([`Entry::describe`]).
    manager: String,
    /// The field.
    path: Path,
}

/// The entry of `me` in `entries` (a new, empty one when there is none).
fn entry_of(entries: &mut Vec<Entry>, me: &Entry) -> usize {
    match entries.iter().position(|e| e.same_writer(me)) {
        Some(i) => i,
        None => {
            entries.push(Entry {
                fields: FieldSet::new(),
                ..me.clone()
            });
            entries.len() - 1
        }
    }
}

/// Applies `config` to `live` (`{}` for a new object) as `me`, updating `entries`; returns the
/// merged object (before the API server's defaults).
///
/// # Errors
/// The conflicts, when there are some and `force` is false (`entries` is then unchanged).
pub(super) fn apply(
    live: &Value,
    config: &Value,
    entries: &mut Vec<Entry>,
    me: &Entry,
    force: bool,
) -> Result<Value, Vec<Conflict>> {
    let mut next = entries.clone();
    let mine = entry_of(&mut next, me);
    let last = std::mem::replace(&mut next[mine].fields, set_of(config));
    let owned: FieldSet = next.iter().flat_map(|e| e.fields.iter().cloned()).collect();
    let owned = with_struct_fields(&owned);
    let stale: FieldSet = with_struct_fields(&last)
        .difference(&owned)
        .cloned()
        .collect();
    let mut object = merge(live, config, true);
    remove(&mut object, &stale);
    let changes = compare(live, &object);
    let conflicts: Vec<Conflict> = next
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != mine)
        .flat_map(|(_, e)| {
            e.fields
                .intersection(&changes.changed)
                .map(|path| Conflict {
                    manager: e.describe(),
                    path: path.clone(),
                })
        })
        .collect();
    if !conflicts.is_empty() && !force {
        return Err(conflicts);
    }
    release(&mut next, mine, &changes);
    *entries = next;
    Ok(object)
}

/// Records an update as `me` from `live` (`{}` for a new object) to `new`, the object as stored.
pub(super) fn update(live: &Value, new: &Value, entries: &mut Vec<Entry>, me: &Entry) {
    let changes = compare(live, new);
    let mine = entry_of(entries, me);
    let members = set_of(new);
    let gained: FieldSet = changes.changed.intersection(&members).cloned().collect();
    let fields = &mut entries[mine].fields;
    fields.retain(|p| !changes.removed.contains(p));
    fields.extend(gained);
    release(entries, mine, &changes);
}

/// Every manager but `mine` loses the fields `changes` changed or removed; empty entries go.
fn release(entries: &mut Vec<Entry>, mine: usize, changes: &Changes) {
    for (i, e) in entries.iter_mut().enumerate() {
        if i != mine {
            e.fields
                .retain(|p| !changes.changed.contains(p) && !changes.removed.contains(p));
        }
    }
    entries.retain(|e| !e.fields.is_empty());
}

/// The 409 `Status` of an apply that `conflicts` stopped, as the API server words it.
pub(super) fn conflict_status(conflicts: &[Conflict]) -> Value {
    let message = match conflicts {
        [one] => format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            one.manager, one.path
        ),
        many => {
            let mut managers: Vec<&str> = many.iter().map(|c| c.manager.as_str()).collect();
            managers.sort_unstable();
            managers.dedup();
            let lines: Vec<String> = managers
                .iter()
                .map(|m| {
                    let paths: Vec<String> = many
                        .iter()
                        .filter(|c| c.manager == *m)
                        .map(|c| format!("- {}", c.path))
                        .collect();
                    format!("conflicts with {m}:\n{}", paths.join("\n"))
                })
                .collect();
            format!(
                "Apply failed with {} conflicts: {}",
                many.len(),
                lines.join("\n")
            )
        }
    };
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|c| {
            json!({"reason": "FieldManagerConflict",
                   "message": format!("conflict with {}", c.manager),
                   "field": c.path.to_string()})
        })
        .collect();
    failure(409, "Conflict", &message, json!({"causes": causes}))
}
