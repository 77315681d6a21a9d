//! Parsing of fencing tokens given as text (the `pg_fencing.token` GUC).
//!
//! A fencing token is a positive 64-bit integer, 1 ..= 9223372036854775807 (docs/design.md, "Terms").
//! Text that is not exactly such an integer is refused, never clamped: `22P02` for text that is
//! not an integer, `22003` for an integer outside bigint, `22023` for zero or a negative number.
//! Surrounding ASCII whitespace and one leading `+` are accepted, as PostgreSQL's `int8in`
//! accepts them.

use thiserror::Error;

/// Why a text is not a fencing token. Each maps to one SQLSTATE (`sqlstate()`).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum TokenError {
    /// 22P02: not an integer.
    #[error("invalid fencing token \"{0}\": not an integer")]
    Syntax(String),
    /// 22003: an integer that does not fit in a bigint.
    #[error("fencing token \"{0}\" is out of range (1 .. 9223372036854775807)")]
    Range(String),
    /// 22023: zero or negative.
    #[error("fencing token {0} is not positive")]
    NotPositive(String),
}

impl TokenError {
    pub fn sqlstate(&self) -> &'static str {
        match self {
            TokenError::Syntax(_) => "22P02",
            TokenError::Range(_) => "22003",
            TokenError::NotPositive(_) => "22023",
        }
    }
}

/// Parse the text form of a token. The empty string (after trimming) means "no token" (`None`).
pub fn parse_token(text: &str) -> Result<Option<i64>, TokenError> {
    let t = text.trim_matches(|c: char| c.is_ascii_whitespace());
    if t.is_empty() {
        return Ok(None);
    }
    let (negative, digits) = match t.as_bytes()[0] {
        b'-' => (true, &t[1..]),
        b'+' => (false, &t[1..]),
        _ => (false, t),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(TokenError::Syntax(text.to_string()));
    }
    let significant = digits.trim_start_matches('0');
    if significant.is_empty() || negative {
        // A negative number is refused as "not positive", even when it would not fit a bigint.
        return Err(TokenError::NotPositive(t.to_string()));
    }
    match significant.parse::<i64>() {
        Ok(v) => Ok(Some(v)),
        Err(_) => Err(TokenError::Range(t.to_string())),
    }
}

/// Check a token that arrived as a bigint.
pub fn check_token(token: i64) -> Result<i64, TokenError> {
    if token <= 0 {
        Err(TokenError::NotPositive(token.to_string()))
    } else {
        Ok(token)
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn accepts_positive_bigints() {
        assert_eq!(parse_token("1").unwrap(), Some(1));
        assert_eq!(parse_token(" 42 ").unwrap(), Some(42));
        assert_eq!(parse_token("+7").unwrap(), Some(7));
        assert_eq!(parse_token("0009").unwrap(), Some(9));
        assert_eq!(parse_token("9223372036854775807").unwrap(), Some(i64::MAX));
        assert_eq!(parse_token("").unwrap(), None);
        assert_eq!(parse_token("   ").unwrap(), None);
    }

    #[test]
    fn refuses_everything_else_with_its_sqlstate() {
        let code = |s: &str| parse_token(s).unwrap_err().sqlstate();
        assert_eq!(code("9223372036854775808"), "22003");
        assert_eq!(code("99999999999999999999999"), "22003");
        assert_eq!(code("0"), "22023");
        assert_eq!(code("-0"), "22023");
        assert_eq!(code("-5"), "22023");
        assert_eq!(code("-9223372036854775809"), "22023");
        assert_eq!(code("12abc"), "22P02");
        assert_eq!(code("1e3"), "22P02");
        assert_eq!(code("1.0"), "22P02");
        assert_eq!(code("+"), "22P02");
        assert_eq!(code("--1"), "22P02");
        assert_eq!(code("1 2"), "22P02");
        assert_eq!(code("\u{0661}"), "22P02");
        assert_eq!(check_token(0).unwrap_err().sqlstate(), "22023");
        assert_eq!(check_token(-1).unwrap_err().sqlstate(), "22023");
        assert_eq!(check_token(5).unwrap(), 5);
    }
}
