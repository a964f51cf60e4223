//! docs/CONFIG.md's `## Keys` rows for the sections declared in key tables, rendered from
//! those tables, and the test that the doc holds exactly them.

use super::keys::{Key, KeyDefault, Section};
use super::zero_keys::ZERO;

/// The sections whose doc rows come from their tables.
const SECTIONS: &[Section] = &[ZERO];

/// A count as the doc writes it: `5e8` for 500,000,000 (one digit times a power of ten
/// from 1e4 up), the number itself otherwise.
fn count_text(n: u64) -> String {
    let mut mantissa = n;
    let mut exponent = 0;
    while mantissa >= 10 && mantissa % 10 == 0 {
        mantissa /= 10;
        exponent += 1;
    }
    if mantissa < 10 && exponent >= 4 {
        format!("{mantissa}e{exponent}")
    } else {
        n.to_string()
    }
}

fn default_text(key: &Key) -> String {
    match key.default {
        KeyDefault::Count(n) => count_text(n),
        KeyDefault::Bool(b) => b.to_string(),
        KeyDefault::Float(x) => format!("{x:?}"),
        KeyDefault::Text(t) => t.to_string(),
        KeyDefault::Only(v) => v.value().to_string(),
    }
}

/// The section's rows: one per key with a doc, keys next to each other with the same
/// default and notes sharing one row. The first row names its key by its full path, the
/// rest by their own names (the doc lists a section's keys under its first).
fn rows(section: &Section) -> Vec<String> {
    let mut groups: Vec<(Vec<&str>, String, &str)> = Vec::new();
    for key in section.keys.iter().filter(|k| !k.doc.is_empty()) {
        let default = default_text(key);
        match groups.last_mut() {
            Some((names, d, doc)) if *d == default && *doc == key.doc => names.push(key.name),
            _ => groups.push((vec![key.name], default, key.doc)),
        }
    }
    groups
        .iter()
        .enumerate()
        .map(|(i, (names, default, doc))| {
            let names: Vec<String> = names
                .iter()
                .map(|n| {
                    if i == 0 {
                        format!("`{}.{n}`", section.path)
                    } else {
                        format!("`{n}`")
                    }
                })
                .collect();
            format!("| {} | {default} | {doc} |", names.join(", "))
        })
        .collect()
}

/// The rows of docs/CONFIG.md's `## Keys` table.
fn doc_table() -> Vec<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/CONFIG.md");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.lines()
        .skip_while(|l| *l != "## Keys")
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .filter(|l| l.starts_with('|'))
        .map(str::to_string)
        .collect()
}

#[test]
fn config_md_rows_are_the_key_tables() {
    let table = doc_table();
    for section in SECTIONS {
        let expected = rows(section);
        let at = table.windows(expected.len()).position(|w| w == expected);
        assert!(
            at.is_some(),
            "docs/CONFIG.md's `## Keys` table should hold these rows of `{}`, one after another, as its key table (zero-runtime/src/config) renders them:\n{}",
            section.path,
            expected.join("\n")
        );
        // No other row documents one of the section's keys a second time.
        let at = at.unwrap_or(0);
        for (i, row) in table.iter().enumerate() {
            if (at..at + expected.len()).contains(&i) {
                continue;
            }
            let first = row.split(" | ").next().unwrap_or("");
            for key in section.keys {
                assert!(
                    !first.contains(&format!("`{}`", key.name))
                        && !first.contains(&format!("`{}.{}`", section.path, key.name)),
                    "docs/CONFIG.md documents `{}` outside its table's rows: {row}",
                    key.name
                );
            }
        }
    }
}

#[test]
fn counts_are_written_as_the_doc_writes_them() {
    assert_eq!(count_text(500_000_000), "5e8");
    assert_eq!(count_text(100_000), "1e5");
    assert_eq!(count_text(0), "0");
    assert_eq!(count_text(1000), "1000");
    assert_eq!(count_text(123_000_000), "123000000");
}
