//! The shape check of the jsonb arguments of the `fenced_*` functions: `key` must name exactly
//! the primary key columns (none of them null), `changes` / `new_row` only columns of the table
//! other than the token column. Values are not converted here: PostgreSQL's
//! `jsonb_populate_record` does that by each column's type.

use std::collections::{BTreeMap, HashSet};
use thiserror::Error;

/// The members of a JSON object: name -> whether the member's value is JSON `null` (all the
/// checks need; the values themselves are converted by PostgreSQL). `src/api/fenced.rs` reads
/// them from the jsonb argument itself.
pub type Members = BTreeMap<String, bool>;

/// Why an argument has the wrong shape. `src/api/fenced.rs` turns each into a PostgreSQL error.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ShapeError {
    /// 22023: not a JSON object.
    #[error("not a JSON object")]
    NotObject,
    /// 42703: a member names no column of the table.
    #[error("unknown column {0}")]
    UnknownColumn(String),
    /// 22023: a member names the token column (pg_fencing stamps it).
    #[error("sets the token column")]
    SetsTokenColumn,
    /// 42P16: the table has no primary key (update and delete find the row by it).
    #[error("no primary key")]
    NoPrimaryKey,
    /// 22023: the key lacks these primary key columns.
    #[error("key lacks primary key columns {0:?}")]
    KeyMissing(Vec<String>),
    /// 22023: the key names these columns that are not in the primary key.
    #[error("key names non-key columns {0:?}")]
    KeyExtra(Vec<String>),
    /// 22023: these key columns are JSON null.
    #[error("key columns are null {0:?}")]
    KeyNull(Vec<String>),
}

/// Checks that every member names a column other than the token column; returns the names,
/// sorted.
pub fn check_columns(
    members: &Members,
    columns: &HashSet<String>,
    token_column: &str,
) -> Result<Vec<String>, ShapeError> {
    if let Some(bad) = members.keys().find(|k| !columns.contains(*k)) {
        return Err(ShapeError::UnknownColumn(bad.clone()));
    }
    if members.contains_key(token_column) {
        return Err(ShapeError::SetsTokenColumn);
    }
    Ok(members.keys().cloned().collect())
}

/// Checks that `key` names exactly the primary key columns `pk`, none of them null.
pub fn check_key(key: &Members, pk: &[String]) -> Result<(), ShapeError> {
    if pk.is_empty() {
        return Err(ShapeError::NoPrimaryKey);
    }
    let missing: Vec<String> = pk
        .iter()
        .filter(|c| !key.contains_key(*c))
        .cloned()
        .collect();
    if !missing.is_empty() {
        return Err(ShapeError::KeyMissing(missing));
    }
    let extra: Vec<String> = key.keys().filter(|c| !pk.contains(c)).cloned().collect();
    if !extra.is_empty() {
        return Err(ShapeError::KeyExtra(extra));
    }
    let nulls: Vec<String> = pk
        .iter()
        .filter(|c| key.get(*c).copied().unwrap_or(false))
        .cloned()
        .collect();
    if !nulls.is_empty() {
        return Err(ShapeError::KeyNull(nulls));
    }
    Ok(())
}

#[cfg(test)]
mod unit {
    use super::*;

    fn cols(names: &[&str]) -> HashSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    /// Members as `fenced.rs` reads them: name -> value is null.
    fn parse_object(text: &str) -> Option<Members> {
        match serde_json::from_str::<serde_json::Value>(text).ok()? {
            serde_json::Value::Object(m) => Some(m.into_iter().map(|(k, v)| (k, v.is_null())).collect()),
            _ => None,
        }
    }

    #[test]
    fn columns_and_keys() {
        let c = cols(&["id", "v", "fence_token"]);
        let m = parse_object(r#"{"v": 1, "id": 2}"#).unwrap();
        assert_eq!(
            check_columns(&m, &c, "fence_token").unwrap(),
            vec!["id", "v"]
        );
        let m = parse_object(r#"{"nope": 1}"#).unwrap();
        assert_eq!(
            check_columns(&m, &c, "fence_token"),
            Err(ShapeError::UnknownColumn("nope".into()))
        );
        let m = parse_object(r#"{"fence_token": 1}"#).unwrap();
        assert_eq!(
            check_columns(&m, &c, "fence_token"),
            Err(ShapeError::SetsTokenColumn)
        );
        let pk = vec!["id".to_string()];
        assert_eq!(
            check_key(&parse_object(r#"{"id": 1}"#).unwrap(), &pk),
            Ok(())
        );
        assert_eq!(
            check_key(&parse_object(r#"{}"#).unwrap(), &pk),
            Err(ShapeError::KeyMissing(vec!["id".into()]))
        );
        assert_eq!(
            check_key(&parse_object(r#"{"id": 1, "v": 2}"#).unwrap(), &pk),
            Err(ShapeError::KeyExtra(vec!["v".into()]))
        );
        assert_eq!(
            check_key(&parse_object(r#"{"id": null}"#).unwrap(), &pk),
            Err(ShapeError::KeyNull(vec!["id".into()]))
        );
        assert_eq!(
            check_key(&parse_object(r#"{"id": 1}"#).unwrap(), &[]),
            Err(ShapeError::NoPrimaryKey)
        );
    }
}
