//! A reader over the YAML tree that records every problem instead of stopping at the first,
//! so `check-config` and start-up can name all bad keys at once.

use std::cell::RefCell;
use std::collections::BTreeSet;

use serde::de::DeserializeOwned;
use serde_yaml_ng::{Mapping, Value};

thread_local! {
    /// The keys read on this thread while [`recording`] runs (list items as `key[]`).
    static READ: RefCell<Option<BTreeSet<String>>> = const { RefCell::new(None) };
}

/// Runs `f`, returning every key path the readers it runs ask for.
pub fn recording(f: impl FnOnce()) -> BTreeSet<String> {
    READ.with(|r| *r.borrow_mut() = Some(BTreeSet::new()));
    f();
    READ.with(|r| r.borrow_mut().take()).unwrap_or_default()
}

fn note_read(path: &str) {
    READ.with(|r| {
        if let Some(keys) = r.borrow_mut().as_mut() {
            let mut normal = String::with_capacity(path.len());
            let mut in_index = false;
            for c in path.chars() {
                match c {
                    '[' => {
                        in_index = true;
                        normal.push('[');
                    }
                    ']' => {
                        in_index = false;
                        normal.push(']');
                    }
                    _ if in_index => {}
                    _ => normal.push(c),
                }
            }
            keys.insert(normal);
        }
    });
}

/// Walks one mapping of the config file. Each `take` removes the key it reads, so that
/// whatever is left at `finish` is an unknown key.
pub struct Fields<'p> {
    path: String,
    map: Mapping,
    problems: &'p mut Vec<String>,
}

impl<'p> Fields<'p> {
    /// Starts at the document root.
    pub fn root(value: Value, problems: &'p mut Vec<String>) -> Self {
        let map = match value {
            Value::Mapping(map) => map,
            Value::Null => Mapping::new(),
            _ => {
                problems.push("the config file must be a mapping of keys to values".into());
                Mapping::new()
            }
        };
        Fields { path: String::new(), map, problems }
    }

    /// The dotted name of `key` under this section, as problems name it.
    pub fn key_path(&self, key: &str) -> String {
        if self.path.is_empty() || key.is_empty() {
            format!("{}{key}", self.path)
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// Records a problem with `key`.
    pub fn problem(&mut self, key: &str, message: impl std::fmt::Display) {
        let path = self.key_path(key);
        self.problems.push(format!("{path}: {message}"));
    }

    /// Whether `key` is present.
    pub fn has(&self, key: &str) -> bool {
        note_read(&self.key_path(key));
        self.map.contains_key(key)
    }

    /// Whether `key` holds a mapping (a nested section) rather than a value.
    pub fn is_section(&self, key: &str) -> bool {
        matches!(self.map.get(key), Some(Value::Mapping(_)))
    }

    /// Removes and deserializes `key`; a missing key or an explicit null is `None`.
    pub fn take<T: DeserializeOwned>(&mut self, key: &str) -> Option<T> {
        note_read(&self.key_path(key));
        let value = self.map.remove(key)?;
        if value.is_null() {
            return None;
        }
        match serde_yaml_ng::from_value(value) {
            Ok(v) => Some(v),
            Err(e) => {
                self.problem(key, format!("{e}"));
                None
            }
        }
    }

    /// Removes a duration `key` as text: a YAML string, or a bare number (`0`, which Go's
    /// `ParseDuration` reads; any other number is refused there for want of a unit).
    pub fn take_duration(&mut self, key: &str) -> Option<String> {
        match self.take::<Value>(key)? {
            Value::Number(n) => Some(n.to_string()),
            other => match serde_yaml_ng::from_value::<String>(other) {
                Ok(text) => Some(text),
                Err(e) => {
                    self.problem(key, format!("{e}"));
                    None
                }
            },
        }
    }

    /// Removes `key` and opens it as a nested section (missing → an empty one).
    pub fn section<R>(&mut self, key: &str, read: impl FnOnce(&mut Fields<'_>) -> R) -> R {
        let path = self.key_path(key);
        note_read(&path);
        let map = match self.map.remove(key) {
            None | Some(Value::Null) => Mapping::new(),
            Some(Value::Mapping(map)) => map,
            Some(_) => {
                self.problems.push(format!("{path}: must be a mapping of keys to values"));
                Mapping::new()
            }
        };
        let mut fields = Fields { path, map, problems: self.problems };
        let out = read(&mut fields);
        fields.finish();
        out
    }

    /// Removes `key` as a list of sections, reading each as `key[i]`.
    pub fn list<R>(&mut self, key: &str, mut read: impl FnMut(&mut Fields<'_>) -> R) -> Vec<R> {
        let path = self.key_path(key);
        note_read(&path);
        let items = match self.map.remove(key) {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Sequence(items)) => items,
            Some(_) => {
                self.problems.push(format!("{path}: must be a list"));
                Vec::new()
            }
        };
        let mut out = Vec::new();
        for (i, item) in items.into_iter().enumerate() {
            let path = format!("{path}[{i}]");
            let map = match item {
                Value::Mapping(map) => map,
                _ => {
                    self.problems.push(format!("{path}: must be a mapping of keys to values"));
                    continue;
                }
            };
            let mut fields = Fields { path, map, problems: self.problems };
            out.push(read(&mut fields));
            fields.finish();
        }
        out
    }

    /// Removes `key` as a mapping of names to sections, reading each as `key.<name>`.
    pub fn entries<R>(&mut self, key: &str, mut read: impl FnMut(&str, &mut Fields<'_>) -> R) -> Vec<R> {
        let path = self.key_path(key);
        note_read(&path);
        let entries = match self.map.remove(key) {
            None | Some(Value::Null) => Mapping::new(),
            Some(Value::Mapping(map)) => map,
            Some(_) => {
                self.problems.push(format!("{path}: must be a mapping of names to sections"));
                Mapping::new()
            }
        };
        let mut out = Vec::new();
        for (name, value) in entries {
            let name = scalar_text(&name).unwrap_or_default();
            let path = format!("{path}.{name}");
            let map = match value {
                Value::Mapping(map) => map,
                _ => {
                    self.problems.push(format!("{path}: must be a mapping of keys to values"));
                    continue;
                }
            };
            let mut fields = Fields { path, map, problems: self.problems };
            out.push(read(&name, &mut fields));
            fields.finish();
        }
        out
    }

    /// Removes `key` as a map of strings (numbers and booleans are turned into text).
    pub fn string_map(&mut self, key: &str) -> std::collections::BTreeMap<String, String> {
        let mut out = std::collections::BTreeMap::new();
        let path = self.key_path(key);
        note_read(&path);
        match self.map.remove(key) {
            None | Some(Value::Null) => {}
            Some(Value::Mapping(map)) => {
                for (k, v) in map {
                    let Some(k) = k.as_str().map(str::to_owned) else {
                        self.problems.push(format!("{path}: keys must be strings"));
                        continue;
                    };
                    match scalar_text(&v) {
                        Some(text) => {
                            out.insert(k, text);
                        }
                        None => self.problems.push(format!("{path}.{k}: must be a string, number or boolean")),
                    }
                }
            }
            Some(_) => self.problems.push(format!("{path}: must be a mapping of keys to values")),
        }
        out
    }

    /// Reports every key nobody asked for.
    pub fn finish(&mut self) {
        let keys: Vec<String> = self.map.keys().map(|k| scalar_text(k).unwrap_or_default()).collect();
        for key in keys {
            self.problem(&key, "unknown key (a typo would silently change delivery, so it is refused)");
        }
        self.map.clear();
    }
}

fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Replaces `${VAR}` in every string of the tree with the environment variable's value.
/// A variable that is not set is a problem naming the key that asked for it.
pub fn expand_env(value: &mut Value, path: &str, env: &dyn Fn(&str) -> Option<String>, problems: &mut Vec<String>) {
    match value {
        Value::String(text) if text.contains("${") => {
            let mut out = String::new();
            let mut rest = text.as_str();
            while let Some(start) = rest.find("${") {
                out.push_str(&rest[..start]);
                let after = &rest[start + 2..];
                let Some(end) = after.find('}') else {
                    problems.push(format!("{path}: unterminated ${{ in value"));
                    return;
                };
                let name = &after[..end];
                match env(name) {
                    Some(v) => out.push_str(&v),
                    None => problems.push(format!("{path}: environment variable {name} is not set")),
                }
                rest = &after[end + 1..];
            }
            out.push_str(rest);
            *text = out;
        }
        Value::Mapping(map) => {
            for (k, v) in map.iter_mut() {
                let key = scalar_text(k).unwrap_or_default();
                let child = if path.is_empty() { key } else { format!("{path}.{key}") };
                expand_env(v, &child, env, problems);
            }
        }
        Value::Sequence(items) => {
            for (i, v) in items.iter_mut().enumerate() {
                expand_env(v, &format!("{path}[{i}]"), env, problems);
            }
        }
        _ => {}
    }
}

/// Applies `OUTBOX__SECTION__KEY=value` overrides: the variable names a key path (double
/// underscore between levels, case-insensitive), the value is read as a YAML scalar.
pub fn apply_overrides(root: &mut Value, vars: impl Iterator<Item = (String, String)>, problems: &mut Vec<String>) {
    for (name, raw) in vars {
        let Some(rest) = name.strip_prefix(super::ENV_PREFIX) else {
            continue;
        };
        let path: Vec<String> = rest.split("__").map(|p| p.to_ascii_lowercase()).collect();
        if path.iter().any(String::is_empty) {
            problems.push(format!("{name}: cannot name a config key"));
            continue;
        }
        let value: Value = serde_yaml_ng::from_str(&raw).unwrap_or(Value::String(raw));
        if !root.is_mapping() {
            *root = Value::Mapping(Mapping::new());
        }
        let mut node = &mut *root;
        for (i, part) in path.iter().enumerate() {
            let Value::Mapping(map) = node else {
                problems.push(format!("{name}: {} is not a section", path[..i].join(".")));
                break;
            };
            let key = Value::String(part.clone());
            if i + 1 == path.len() {
                map.insert(key, value.clone());
                break;
            }
            node = map.entry(key).or_insert_with(|| Value::Mapping(Mapping::new()));
            if node.is_null() {
                *node = Value::Mapping(Mapping::new());
            }
        }
    }
}
