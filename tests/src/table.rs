//! Plain-text tables (Markdown pipe tables) for the reports: a left-aligned label column and
//! right-aligned value columns, each as wide as its widest cell.

use std::fmt::Write as _;

/// Renders `rows` (a label and one value per column) under `header` (the label column's title,
/// then one title per value column).
pub fn render(header: &[&str], rows: &[(&str, Vec<String>)]) -> String {
    let columns = header.len();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for (label, values) in rows {
        widths[0] = widths[0].max(label.chars().count());
        for (w, v) in widths.iter_mut().skip(1).zip(values) {
            *w = (*w).max(v.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: &[&str]| {
        out.push('|');
        for (i, w) in widths.iter().enumerate() {
            let cell = cells.get(i).copied().unwrap_or("");
            if i == 0 {
                let _ = write!(out, " {cell:<w$} |");
            } else {
                let _ = write!(out, " {cell:>w$} |");
            }
        }
        out.push('\n');
    };
    line(&mut out, header);
    out.push('|');
    for w in &widths {
        let _ = write!(out, "{:-<1$}|", "", w + 2);
    }
    out.push('\n');
    for (label, values) in rows {
        let mut cells = Vec::with_capacity(columns);
        cells.push(*label);
        cells.extend(values.iter().map(String::as_str));
        line(&mut out, &cells);
    }
    out
}

/// Runs side by side under a `measure` column: each run's title and its rows (label and value),
/// every run with the same labels in the same order (the first run's are printed).
pub fn side_by_side(runs: &[(&str, Vec<(&str, String)>)]) -> String {
    let mut header = vec!["measure"];
    header.extend(runs.iter().map(|(title, _)| *title));
    let labels = runs
        .first()
        .map(|(_, rows)| rows.as_slice())
        .unwrap_or_default();
    let rows: Vec<(&str, Vec<String>)> = labels
        .iter()
        .enumerate()
        .map(|(i, (label, _))| {
            let values = runs.iter().map(|(_, rows)| rows[i].1.clone()).collect();
            (*label, values)
        })
        .collect();
    render(&header, &rows)
}

/// The cells of the row of `text` (a [`render`]ed table) labelled `label`, label first.
///
/// # Panics
/// When the table has no such row.
#[cfg(test)]
pub(crate) fn row(text: &str, label: &str) -> Vec<String> {
    text.lines()
        .find(|l| l.starts_with(&format!("| {label} ")))
        .unwrap_or_else(|| panic!("no row {label} in\n{text}"))
        .split('|')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_as_wide_as_their_widest_cell() {
        let text = render(
            &["measure", "a", "b"],
            &[
                ("sessions", vec!["200".into(), "2000".into()]),
                ("lost", vec!["0".into(), "17".into()]),
            ],
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "| measure  |   a |    b |");
        assert_eq!(lines[1], "|----------|-----|------|");
        assert_eq!(lines[2], "| sessions | 200 | 2000 |");
        assert_eq!(lines[3], "| lost     |   0 |   17 |");
    }
}
