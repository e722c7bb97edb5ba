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
