//! Fuzz target: the shape check of the `fenced_*` jsonb arguments (`pg_fencing_core::json`).
//! Never panics; accepts exactly the JSON objects (as serde_json reads them); keeps every member
//! and its JSON text verbatim; and the column and key checks agree with their definitions.
#![no_main]
use libfuzzer_sys::fuzz_target;
use pg_fencing_core::json::{check_columns, check_key, parse_object, ShapeError};
use std::collections::HashSet;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let reference = serde_json::from_str::<serde_json::Value>(text);
    let parsed = parse_object(text);
    match (&reference, &parsed) {
        (Ok(serde_json::Value::Object(map)), Ok(members)) => {
            let mut a: Vec<&String> = map.keys().collect();
            let mut b: Vec<&String> = members.keys().collect();
            a.sort();
            b.sort();
            assert_eq!(a, b, "members of {text:?}");
            for (k, raw) in members {
                // The raw text of each member is itself valid JSON (numbers may exceed f64, so
                // compare shapes only when serde_json can hold the value).
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(raw) {
                    assert_eq!(&v, &map[k], "member {k:?} of {text:?}");
                }
            }
        }
        (Ok(serde_json::Value::Object(_)), Err(e)) => panic!("object refused: {text:?}: {e}"),
        (Ok(_), Ok(_)) => panic!("non-object accepted: {text:?}"),
        (Err(_), Ok(_)) => {
            // serde_json's Value refuses numbers out of f64 range that RawValue keeps; anything
            // else accepted must still parse as raw JSON.
            assert!(serde_json::from_str::<Box<serde_json::value::RawValue>>(text).is_ok(), "invalid JSON accepted: {text:?}");
        }
        _ => {}
    }
    if let Ok(members) = parsed {
        let columns: HashSet<String> = ["id", "v", "fence_token", "Odd \"Name\""].iter().map(|s| s.to_string()).collect();
        match check_columns(&members, &columns, "fence_token") {
            Ok(names) => {
                assert!(names.iter().all(|n| columns.contains(n) && n != "fence_token"));
                assert_eq!(names.len(), members.len());
            }
            Err(ShapeError::UnknownColumn(c)) => assert!(!columns.contains(&c)),
            Err(ShapeError::SetsTokenColumn) => assert!(members.contains_key("fence_token")),
            Err(e) => panic!("unexpected {e}"),
        }
        let pk = vec!["id".to_string(), "Odd \"Name\"".to_string()];
        let ok = pk.iter().all(|c| members.get(c).map(|v| v != "null").unwrap_or(false))
            && members.keys().all(|k| pk.contains(k));
        assert_eq!(check_key(&members, &pk).is_ok(), ok, "key check of {text:?}");
    }
});
