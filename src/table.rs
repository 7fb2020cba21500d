//! Text tables for people: the `cluster`, `orphans`, `pools` and `validate` commands print theirs
//! through [`render`].

use std::fmt::Write;

/// Appends `rows` under `header` (none when it is empty), each line after `indent`: every column but
/// the last padded to its widest cell, two spaces apart. A row may be shorter than the others; its
/// last cell is never padded, and lines carry no trailing spaces.
pub fn render(
    out: &mut String,
    indent: &str,
    header: &[&str],
    rows: impl IntoIterator<Item = Vec<String>>,
) {
    let header = (!header.is_empty()).then(|| header.iter().map(|h| h.to_string()).collect());
    let lines: Vec<Vec<String>> = header.into_iter().chain(rows).collect();
    let mut widths: Vec<usize> = Vec::new();
    for row in &lines {
        let padded = &row[..row.len().saturating_sub(1)];
        widths.resize(widths.len().max(padded.len()), 0);
        for (width, cell) in widths.iter_mut().zip(padded) {
            *width = (*width).max(cell.chars().count());
        }
    }
    for row in &lines {
        let mut line = indent.to_string();
        for (i, cell) in row.iter().enumerate() {
            let width = if i + 1 == row.len() { 0 } else { widths[i] };
            let _ = write!(line, "{cell:<width$}  ");
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
}

/// A cell for a value that may be missing: the value, or `-`.
pub fn or_dash(value: Option<impl ToString>) -> String {
    value.map_or_else(|| "-".into(), |v| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_to_their_widest_cell_and_the_last_is_not_padded() {
        let mut out = String::new();
        let rows = vec![
            vec![
                "pve1".to_string(),
                "online".into(),
                "a long last cell".into(),
            ],
            vec!["pve-two".to_string(), "offline".into()],
            vec!["x".to_string(), "".into(), "".into()],
        ];
        render(&mut out, "  ", &["NODE", "STATUS", "NOTE"], rows.clone());
        assert_eq!(
            out,
            "  NODE     STATUS  NOTE\n  pve1     online  a long last cell\n  pve-two  offline\n  x\n"
        );
        let mut bare = String::new();
        render(&mut bare, "", &[], rows[1..2].to_vec());
        assert_eq!(bare, "pve-two  offline\n");
    }
}
