//! Fuzz target: `pg_fencing_core::token::parse_token` (what `SET pg_fencing.token` accepts).
//! Never panics, and agrees with a reference parse of the same rule done with 128-bit integers:
//! a token is exactly a positive bigint, with optional surrounding ASCII whitespace and one
//! leading `+`; anything else is refused with the documented SQLSTATE, never clamped.
#![no_main]
use libfuzzer_sys::fuzz_target;
use pg_fencing_core::token::parse_token;

fn reference(text: &str) -> Result<Option<i64>, &'static str> {
    let t = text.trim_matches(|c: char| c.is_ascii_whitespace());
    if t.is_empty() {
        return Ok(None);
    }
    let (neg, digits) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err("22P02");
    }
    let trimmed = digits.trim_start_matches('0');
    if trimmed.is_empty() || neg {
        return Err("22023");
    }
    if trimmed.len() > 19 {
        return Err("22003");
    }
    let v: i128 = trimmed.parse().map_err(|_| "22P02")?;
    if v > i64::MAX as i128 {
        Err("22003")
    } else {
        Ok(Some(v as i64))
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let got = parse_token(text).map_err(|e| e.sqlstate());
    assert_eq!(got, reference(text), "input {text:?}");
    if let Ok(Some(v)) = got {
        assert!(v >= 1);
    }
});
