//! A config section's keys declared once: each key's name, the other name DeepSpeed takes
//! for it, its default, where it applies, and the notes docs/CONFIG.md prints for it. The
//! keys a section allows, the "did you mean" suggestions, the defaults the parsers read
//! and the doc's rows (checked by a test) all come from these tables.

use super::json::{Obj, Unsupported};
use super::ConfigError;
use serde_json::{Map, Value};
use std::sync::LazyLock;

/// One section's keys, in the order they are checked and documented.
#[derive(Debug, Clone, Copy)]
pub(super) struct Section {
    /// The section's dotted path (`zero_optimization`; empty for the top level).
    pub path: &'static str,
    /// How docs/CONFIG.md's rows name the keys.
    #[cfg_attr(not(test), allow(dead_code))]
    pub names: DocNames,
    /// The keys. Their order is the order of the suggestions' candidates (keys zero reads
    /// first, then the keys it accepts only at DeepSpeed's default, each in table order),
    /// of the aliases and of the section's doc rows (the top level's rows each stand where
    /// the doc puts them, among the sections' rows).
    pub keys: &'static [Key],
}

/// One key of a section.
#[derive(Debug, Clone, Copy)]
pub(super) struct Key {
    /// The name DeepSpeed documents.
    pub name: &'static str,
    /// Another name DeepSpeed reads for it (the stage-3 keys' short names), read as `name`.
    pub alias: Option<&'static str>,
    /// The default, or the one value accepted for a key zero does not implement.
    pub default: KeyDefault,
    /// The stages the key applies to.
    pub applies: Applies,
    /// The notes column of docs/CONFIG.md's row; `None`: no row. Keys next to each other
    /// with the same notes share one row. Read by the test that checks the doc
    /// (`doc_table`).
    #[cfg_attr(not(test), allow(dead_code))]
    pub doc: Option<&'static str>,
    /// The default column of a row that names several keys, where the doc words their
    /// defaults together; `None`: their common default, or their defaults one after
    /// another.
    #[cfg_attr(not(test), allow(dead_code))]
    pub doc_default: Option<&'static str>,
    /// For a key zero does not implement: what the error for another value adds (what
    /// zero does instead, what to use).
    pub why: Option<&'static str>,
}

/// How a section's doc rows name its keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DocNames {
    /// Every key by its full path, with its alias (`` `bf16` (alias `bfloat16`) ``).
    Path,
    /// The first row's key by its full path, the rest by their own names (the doc lists
    /// the section's keys under its first); aliases are not shown.
    FirstPath,
}

/// A key's default.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum KeyDefault {
    /// A whole number (the doc writes `5e8` for 500,000,000).
    Count(u64),
    /// A boolean.
    Bool(bool),
    /// A number.
    Float(f64),
    /// Two numbers (`betas`).
    Pair(f64, f64),
    /// A default the parser works out (from other keys, or a subsection's own keys), as
    /// the doc words it.
    Text(&'static str),
    /// A DeepSpeed key zero does not implement: accepted only at this value (DeepSpeed's
    /// default, which changes nothing) or `null`; any other value is an error.
    Only(Fixed),
}

/// A JSON value written in a table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Fixed {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A whole number.
    Int(i64),
    /// A number.
    Float(f64),
    /// A string.
    Str(&'static str),
    /// An object.
    Object(&'static [(&'static str, Fixed)]),
}

/// The stages a key applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Applies {
    /// Every stage.
    Always,
    /// Stage 3; with `noted`, setting it at stages 0-2 is noted as without effect.
    Stage3 {
        /// Whether setting it below stage 3 is noted.
        noted: bool,
    },
}

impl Key {
    /// A key zero reads, with its default, applying at every stage, with no doc row.
    pub const fn new(name: &'static str, default: KeyDefault) -> Self {
        Self {
            name,
            alias: None,
            default,
            applies: Applies::Always,
            doc: None,
            doc_default: None,
            why: None,
        }
    }

    /// A DeepSpeed key zero does not implement, accepted only at `value`.
    pub const fn only(name: &'static str, value: Fixed) -> Self {
        Self::new(name, KeyDefault::Only(value))
    }

    /// For a key accepted only at one value: what the error for another value adds.
    pub const fn why(self, text: &'static str) -> Self {
        Self {
            why: Some(text),
            ..self
        }
    }

    /// With another name DeepSpeed reads for it.
    pub const fn alias(self, alias: &'static str) -> Self {
        Self {
            alias: Some(alias),
            ..self
        }
    }

    /// Applying at stage 3 only; `noted`: set below stage 3, it is noted.
    pub const fn stage3(self, noted: bool) -> Self {
        Self {
            applies: Applies::Stage3 { noted },
            ..self
        }
    }

    /// With the notes of its doc row.
    pub const fn doc(self, doc: &'static str) -> Self {
        Self {
            doc: Some(doc),
            ..self
        }
    }

    /// With the default column of the row it shares with the keys next to it.
    pub const fn doc_default(self, text: &'static str) -> Self {
        Self {
            doc_default: Some(text),
            ..self
        }
    }

    /// The default of a count key (use it in `const { }`, where another kind fails to
    /// compile).
    pub const fn count(&self) -> u64 {
        match self.default {
            KeyDefault::Count(n) => n,
            _ => panic!("not a count key"),
        }
    }

    /// The default of a number key (use it in `const { }`, where another kind fails to
    /// compile).
    pub const fn float(&self) -> f64 {
        match self.default {
            KeyDefault::Float(x) => x,
            _ => panic!("not a number key"),
        }
    }

    /// The default of a two-number key (use it in `const { }`, where another kind fails
    /// to compile).
    pub const fn pair(&self) -> (f64, f64) {
        match self.default {
            KeyDefault::Pair(a, b) => (a, b),
            _ => panic!("not a two-number key"),
        }
    }

    /// The default of a boolean key (use it in `const { }`, where another kind fails to
    /// compile).
    pub const fn flag(&self) -> bool {
        match self.default {
            KeyDefault::Bool(b) => b,
            _ => panic!("not a boolean key"),
        }
    }
}

impl Fixed {
    /// As JSON.
    pub fn value(self) -> Value {
        match self {
            Fixed::Null => Value::Null,
            Fixed::Bool(b) => Value::Bool(b),
            Fixed::Int(i) => Value::from(i),
            Fixed::Float(x) => Value::from(x),
            Fixed::Str(t) => Value::from(t),
            Fixed::Object(fields) => Value::Object(
                fields
                    .iter()
                    .map(|(k, v)| ((*k).to_string(), v.value()))
                    .collect(),
            ),
        }
    }
}

impl Section {
    /// This top-level section of `top` (an empty one when absent), its keys checked
    /// against the table.
    pub fn open<'a>(&self, top: &Obj<'a>) -> Result<Obj<'a>, ConfigError> {
        static EMPTY: LazyLock<Value> = LazyLock::new(|| Value::Object(Map::new()));
        Obj::new(
            self.path,
            top.get(self.path).unwrap_or(&EMPTY),
            &self.known(),
            &self.unsupported(),
        )
    }

    /// The keys zero reads, in table order.
    pub fn known(&self) -> Vec<&'static str> {
        self.keys
            .iter()
            .filter(|k| !matches!(k.default, KeyDefault::Only(_)))
            .map(|k| k.name)
            .collect()
    }

    /// The keys zero accepts only at DeepSpeed's default, with that value and what the
    /// error for another value adds, in table order.
    pub fn unsupported(&self) -> Vec<Unsupported> {
        self.keys
            .iter()
            .filter_map(|k| match k.default {
                KeyDefault::Only(v) => Some(Unsupported {
                    name: k.name,
                    only: v.value(),
                    why: k.why,
                }),
                _ => None,
            })
            .collect()
    }

    /// `(alias, name)` of every key with an alias, in table order.
    pub fn aliases(&self) -> impl Iterator<Item = (&'static str, &'static str)> {
        self.keys
            .iter()
            .filter_map(|k| k.alias.map(|a| (a, k.name)))
    }

    /// The keys that apply at stage 3 only and are noted when set below it, in table order.
    pub fn noted_below_stage3(&self) -> impl Iterator<Item = &'static str> {
        self.keys
            .iter()
            .filter(|k| k.applies == Applies::Stage3 { noted: true })
            .map(|k| k.name)
    }
}
