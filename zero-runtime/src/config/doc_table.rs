//! docs/CONFIG.md's `## Keys` rows, rendered from the key tables, and the tests that the
//! doc holds exactly them.

use super::checkpoint_keys::CHECKPOINT_SECTION;
use super::keys::{DocNames, Fixed, Key, KeyDefault, Section};
use super::optimizer_keys::OPTIMIZER_SECTION;
use super::precision_keys::DATA_TYPES_SECTION;
use super::top_keys::TOP;
use super::zero_keys::ZERO;

/// The sections whose doc rows come from their tables.
const SECTIONS: &[Section] = &[
    TOP,
    OPTIMIZER_SECTION,
    DATA_TYPES_SECTION,
    ZERO,
    CHECKPOINT_SECTION,
];

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

/// A value as the doc writes it in JSON.
fn json_text(v: Fixed) -> String {
    match v {
        Fixed::Str(t) => format!("{t:?}"),
        Fixed::Object(fields) => {
            let fields: Vec<String> = fields
                .iter()
                .map(|(k, v)| format!("{k:?}: {}", json_text(*v)))
                .collect();
            format!("{{{}}}", fields.join(", "))
        }
        Fixed::Float(x) => format!("{x:?}"),
        other => other.value().to_string(),
    }
}

/// A value accepted only at DeepSpeed's default as the doc writes it: strings and
/// objects as code, the rest bare.
fn fixed_text(v: Fixed) -> String {
    match v {
        Fixed::Str(t) => format!("`{t}`"),
        Fixed::Object(_) => format!("`{}`", json_text(v)),
        other => json_text(other),
    }
}

fn default_text(key: &Key) -> String {
    match key.default {
        KeyDefault::Count(n) => count_text(n),
        KeyDefault::Bool(b) => b.to_string(),
        KeyDefault::Float(x) => format!("{x:?}"),
        KeyDefault::Pair(a, b) => format!("[{a:?}, {b:?}]"),
        KeyDefault::Text(t) => t.to_string(),
        KeyDefault::Only(v) => fixed_text(v),
    }
}

/// How a row names `key`; `first`: in the section's first row.
fn name_text(section: &Section, key: &Key, first: bool) -> String {
    match section.names {
        DocNames::Path => {
            let full = if section.path.is_empty() {
                key.name.to_string()
            } else {
                format!("{}.{}", section.path, key.name)
            };
            match key.alias {
                Some(alias) => format!("`{full}` (alias `{alias}`)"),
                None => format!("`{full}`"),
            }
        }
        DocNames::FirstPath if first => format!("`{}.{}`", section.path, key.name),
        DocNames::FirstPath => format!("`{}`", key.name),
    }
}

/// The section's rows: one per key with a doc, keys next to each other with the same
/// notes sharing one row, whose default column is the one the keys give for it, else
/// their common default, else their defaults one after another.
fn rows(section: &Section) -> Vec<String> {
    let mut groups: Vec<(Vec<&Key>, &str)> = Vec::new();
    for key in section.keys {
        let Some(doc) = key.doc else { continue };
        match groups.last_mut() {
            Some((keys, d)) if *d == doc => keys.push(key),
            _ => groups.push((vec![key], doc)),
        }
    }
    groups
        .iter()
        .enumerate()
        .map(|(i, (keys, doc))| {
            let names: Vec<String> = keys.iter().map(|k| name_text(section, k, i == 0)).collect();
            let mut defaults: Vec<String> = keys.iter().map(|k| default_text(k)).collect();
            defaults.dedup();
            let default = keys[0]
                .doc_default
                .map_or_else(|| defaults.join(", "), str::to_string);
            let row = format!("| {} | {default} | {doc}", names.join(", "));
            format!("{} |", row.trim_end())
        })
        .collect()
}

/// The section's rows in the runs the doc keeps together: a section's rows one after
/// another, each of the top level's rows on its own (they sit among the sections').
fn blocks(section: &Section) -> Vec<Vec<String>> {
    let rows = rows(section);
    if section.path.is_empty() {
        rows.into_iter().map(|r| vec![r]).collect()
    } else {
        vec![rows]
    }
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
        let name = if section.path.is_empty() {
            "the top level".to_string()
        } else {
            format!("`{}`", section.path)
        };
        let mut rendered = Vec::new();
        for expected in blocks(section) {
            let at = table.windows(expected.len()).position(|w| w == expected);
            assert!(
                at.is_some(),
                "docs/CONFIG.md's `## Keys` table should hold these rows of {name}, one after another, as its key table (zero-runtime/src/config) renders them:\n{}",
                expected.join("\n")
            );
            let at = at.unwrap_or(0);
            rendered.extend(at..at + expected.len());
        }
        // No other row documents one of the section's keys a second time.
        for (i, row) in table.iter().enumerate() {
            if rendered.contains(&i) {
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
fn config_md_has_no_row_outside_the_key_tables() {
    let rendered: Vec<String> = SECTIONS.iter().flat_map(rows).collect();
    for row in doc_table().iter().skip(2) {
        assert!(
            rendered.contains(row),
            "docs/CONFIG.md's `## Keys` table has a row no key table (zero-runtime/src/config) renders: {row}"
        );
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
