//! Reading DeepSpeed JSON objects key by key: unknown keys are errors with a suggestion,
//! numbers may be written `5e8`, and `"auto"` is recognised.

use super::ConfigError;
use serde_json::{Map, Value};

/// A DeepSpeed key zero does not implement, as a section's parser checks it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Unsupported {
    /// Its name.
    pub name: &'static str,
    /// The one value accepted (DeepSpeed's default, which changes nothing; `null` too).
    pub only: Value,
    /// What the error for another value adds.
    pub why: Option<&'static str>,
}

/// One JSON object being read, with the keys it may hold.
pub(super) struct Obj<'a> {
    path: String,
    map: &'a Map<String, Value>,
}

/// A value that may be `"auto"`.
pub(super) enum Auto<T> {
    Auto,
    Value(T),
}

impl<'a> Obj<'a> {
    /// Checks every key of `value` (which must be an object) is in `known` or `unsupported`.
    /// `unsupported` lists known DeepSpeed keys we do not implement, with the value that
    /// leaves DeepSpeed's behaviour unchanged: that value is accepted, any other is an error.
    pub fn new(
        path: &str,
        value: &'a Value,
        known: &[&str],
        unsupported: &[Unsupported],
    ) -> Result<Self, ConfigError> {
        let map = value.as_object().ok_or_else(|| ConfigError::InvalidValue {
            key: path.to_string(),
            reason: format!("expected a JSON object, got {value}"),
        })?;
        for (key, v) in map {
            if known.contains(&key.as_str()) {
                continue;
            }
            if let Some(u) = unsupported.iter().find(|u| u.name == key) {
                if *v == u.only || v.is_null() {
                    continue;
                }
                let why = u.why.map(|w| format!("; {w}")).unwrap_or_default();
                return Err(ConfigError::Unsupported {
                    key: join(path, key),
                    reason: format!(
                        "only the DeepSpeed default {} is supported, got {v}{why}",
                        u.only
                    ),
                });
            }
            let all = known
                .iter()
                .copied()
                .chain(unsupported.iter().map(|u| u.name));
            return Err(ConfigError::UnknownKey {
                key: join(path, key),
                suggestion: closest(key, all),
            });
        }
        Ok(Self {
            path: path.to_string(),
            map,
        })
    }

    /// The full path of `key`, for errors.
    pub fn path(&self, key: &str) -> String {
        join(&self.path, key)
    }

    /// The value of `key`, treating JSON `null` as absent.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// `key` as a number or `"auto"`; numbers may be written `5e8`.
    pub fn number(&self, key: &str) -> Result<Option<Auto<f64>>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) if s == "auto" => Ok(Some(Auto::Auto)),
            Some(Value::Number(n)) => n
                .as_f64()
                .map(|f| Some(Auto::Value(f)))
                .ok_or_else(|| self.invalid(key, "not a finite number")),
            Some(v) => Err(self.invalid(key, &format!("expected a number or \"auto\", got {v}"))),
        }
    }

    /// `key` as a float; `"auto"` and absence give `default`.
    pub fn f64_or(&self, key: &str, default: f64) -> Result<f64, ConfigError> {
        Ok(match self.number(key)? {
            Some(Auto::Value(v)) => v,
            _ => default,
        })
    }

    /// `key` as a non-negative whole number (`5e8` accepted); `"auto"` → `Auto`.
    pub fn count(&self, key: &str) -> Result<Option<Auto<u64>>, ConfigError> {
        match self.number(key)? {
            None => Ok(None),
            Some(Auto::Auto) => Ok(Some(Auto::Auto)),
            Some(Auto::Value(v)) if v >= 0.0 && v.fract() == 0.0 && v < 1.8e19 => {
                Ok(Some(Auto::Value(v as u64)))
            }
            Some(Auto::Value(v)) => {
                Err(self.invalid(key, &format!("expected a whole number >= 0, got {v}")))
            }
        }
    }

    /// `key` as a whole number; `"auto"` and absence give `default`.
    pub fn count_or(&self, key: &str, default: u64) -> Result<u64, ConfigError> {
        Ok(match self.count(key)? {
            Some(Auto::Value(v)) => v,
            _ => default,
        })
    }

    /// `key` as a boolean; `"auto"` and absence give `default`.
    pub fn bool_or(&self, key: &str, default: bool) -> Result<bool, ConfigError> {
        match self.get(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(Value::String(s)) if s == "auto" => Ok(default),
            Some(v) => Err(self.invalid(key, &format!("expected true or false, got {v}"))),
        }
    }

    /// `key` as a string.
    pub fn str(&self, key: &str) -> Result<Option<&'a str>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.invalid(key, &format!("expected a string, got {v}"))),
        }
    }

    /// An error about `key`'s value.
    pub fn invalid(&self, key: &str, reason: &str) -> ConfigError {
        ConfigError::InvalidValue {
            key: self.path(key),
            reason: reason.to_string(),
        }
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// The known key most like `key`, if any is close enough to be a likely misspelling.
fn closest<'k>(key: &str, known: impl Iterator<Item = &'k str>) -> Option<String> {
    known
        .map(|k| (strsim::normalized_damerau_levenshtein(key, k), k))
        .filter(|(score, _)| *score >= 0.6)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, k)| k.to_string())
}
