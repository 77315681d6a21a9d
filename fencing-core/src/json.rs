//! The shape check of the jsonb arguments of the `fenced_*` functions: `key` must name exactly
//! the primary key columns (none of them null), `changes` / `new_row` only columns of the table
//! other than the token column. Values are not converted here: PostgreSQL's
//! `jsonb_populate_record` does that by each column's type.

use std::collections::{BTreeMap, HashSet};
use thiserror::Error;

/// The members of a JSON object: name -> the member's JSON text, exactly as written (numbers are
/// not converted, so no number is ever rounded or refused for not fitting an f64).
pub type Members = BTreeMap<String, String>;

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

/// The members of `text` (the text form of a jsonb value), if it is an object.
pub fn parse_object(text: &str) -> Result<Members, ShapeError> {
    if !text.trim_start().starts_with('{') {
        return Err(ShapeError::NotObject);
    }
    let members: BTreeMap<String, Box<serde_json::value::RawValue>> =
        serde_json::from_str(text).map_err(|_| ShapeError::NotObject)?;
    Ok(members
        .into_iter()
        .map(|(k, v)| (k, v.get().to_string()))
        .collect())
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
        .filter(|c| key.get(*c).map(|v| v == "null").unwrap_or(false))
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

    #[test]
    fn objects_only_and_numbers_kept_verbatim() {
        assert_eq!(parse_object("[1]"), Err(ShapeError::NotObject));
        assert_eq!(parse_object("null"), Err(ShapeError::NotObject));
        assert_eq!(parse_object("\"{\""), Err(ShapeError::NotObject));
        let m = parse_object(r#"{"id": 1e400, "v": {"a": [1, 2]}}"#).unwrap();
        assert_eq!(m["id"], "1e400");
        assert_eq!(m["v"], r#"{"a": [1, 2]}"#);
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
