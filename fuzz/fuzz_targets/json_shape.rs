//! Fuzz target: the shape check of the `fenced_*` jsonb arguments (`pg_fencing_core::json`).
//! The extension reads the members of a jsonb object itself (`src/api/fenced.rs`: name -> value is
//! null); here any JSON object, read by serde_json, stands in for one. The column and key checks
//! never panic and agree with their definitions.
#![no_main]
use libfuzzer_sys::fuzz_target;
use pg_fencing_core::json::{check_columns, check_key, Members, ShapeError};
use std::collections::HashSet;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(serde_json::Value::Object(map)) = serde_json::from_str::<serde_json::Value>(text) else {
        return;
    };
    let members: Members = map.iter().map(|(k, v)| (k.clone(), v.is_null())).collect();
    let columns: HashSet<String> = ["id", "v", "fence_token", "Odd \"Name\""].iter().map(|s| s.to_string()).collect();
    match check_columns(&members, &columns, "fence_token") {
        Ok(names) => {
            assert!(names.iter().all(|n| columns.contains(n) && n != "fence_token"));
            assert_eq!(names.len(), members.len());
            assert!(names.windows(2).all(|w| w[0] < w[1]), "names sorted");
        }
        Err(ShapeError::UnknownColumn(c)) => assert!(!columns.contains(&c)),
        Err(ShapeError::SetsTokenColumn) => assert!(members.contains_key("fence_token")),
        Err(e) => panic!("unexpected {e}"),
    }
    let pk = vec!["id".to_string(), "Odd \"Name\"".to_string()];
    let ok = pk.iter().all(|c| members.get(c) == Some(&false)) && members.keys().all(|k| pk.contains(k));
    assert_eq!(check_key(&members, &pk).is_ok(), ok, "key check of {text:?}");
});
