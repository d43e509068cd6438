//! The module docs' tag table, rendered from the declarations in
//! `message.rs`; a test holds the docs to it (`cargo test` prints the table
//! to paste when they differ).

use super::message::message_rows;

/// One row of the table: one field of a message or record.
pub(super) struct Row {
    pub(super) tag: u16,
    /// The tag's constant.
    pub(super) constant: &'static str,
    /// The struct field.
    pub(super) field: &'static str,
    /// The value's layout, notes and presence.
    pub(super) value: String,
    /// For a record field: the record, which the table lists too.
    pub(super) record: Option<Record>,
}

/// A record a field holds: its name and rows.
#[derive(Clone, Copy)]
pub(super) struct Record {
    pub(super) name: &'static str,
    pub(super) rows: fn() -> Vec<Row>,
}

/// The table, one line per row, as the module docs hold it (without `//! `):
/// the messages in declaration order, then each record they use, once.
pub(super) fn render() -> Vec<String> {
    let mut cells = vec![
        ["Message (type)", "Tag", "Field", "Value", "Constant"].map(String::from),
    ];
    let mut records: Vec<Record> = Vec::new();
    for (name, number, rows) in message_rows() {
        add(format!("`{name}` ({number})"), rows, &mut cells, &mut records);
    }
    // Records found while adding records are added after them.
    let mut next = 0;
    while let Some(&record) = records.get(next) {
        let name = record.name;
        add(format!("`{name}` record"), (record.rows)(), &mut cells, &mut records);
        next += 1;
    }
    align(&cells)
}

/// The rows of one message or record, its name on the first.
fn add(
    owner: String,
    rows: Vec<Row>,
    cells: &mut Vec<[String; 5]>,
    records: &mut Vec<Record>,
) {
    if rows.is_empty() {
        cells.push([owner, String::new(), "(none)".into(), String::new(), String::new()]);
        return;
    }
    let mut owner = Some(owner);
    for row in rows {
        if let Some(record) = row.record {
            if !records.iter().any(|r| r.name == record.name) {
                records.push(record);
            }
        }
        cells.push([
            owner.take().unwrap_or_default(),
            format!("`{:#06x}`", row.tag),
            format!("`{}`", row.field),
            row.value,
            format!("`{}`", row.constant),
        ]);
    }
}

/// A Markdown table with every column as wide as its widest cell.
fn align(cells: &[[String; 5]]) -> Vec<String> {
    let width = |c: &String| c.chars().count();
    let mut widths = [0; 5];
    for row in cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(width(c));
        }
    }
    let line = |row: &[String; 5]| {
        let padded: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(c, w)| format!(" {c}{} ", " ".repeat(w - width(c))))
            .collect();
        format!("|{}|", padded.join("|"))
    };
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(w + 2)).collect();
    let mut lines = Vec::with_capacity(cells.len() + 1);
    let mut rows = cells.iter();
    if let Some(header) = rows.next() {
        lines.push(line(header));
        lines.push(format!("|{}|", rule.join("|")));
    }
    lines.extend(rows.map(line));
    lines
}
