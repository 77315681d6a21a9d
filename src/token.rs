//! Fencing tokens given as text (the `pg_fencing.token` GUC). The parsing itself is in
//! `pg_fencing_core::token` (no PostgreSQL needed, so it is fuzzed on its own, see `fuzz/`);
//! here its errors become pg_fencing's (`22P02`, `22003`, `22023`; never clamped).

use crate::error::{FenceError, Token};
use pg_fencing_core::token::{self as core_token, TokenError};

impl From<TokenError> for FenceError {
    fn from(e: TokenError) -> Self {
        match e {
            TokenError::Syntax(s) => FenceError::TokenSyntax(s),
            TokenError::Range(s) => FenceError::TokenRange(s),
            TokenError::NotPositive(s) => FenceError::TokenNotPositive(s),
        }
    }
}

/// Parse the text form of a token. The empty string (after trimming) means "no token" (`None`).
pub fn parse_token(text: &str) -> Result<Option<Token>, FenceError> {
    Ok(core_token::parse_token(text)?)
}

/// Check a token that arrived as a bigint.
pub fn check_token(token: i64) -> Result<Token, FenceError> {
    Ok(core_token::check_token(token)?)
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn core_errors_keep_their_sqlstate() {
        for (text, code) in [
            ("x", "22P02"),
            ("9223372036854775808", "22003"),
            ("0", "22023"),
        ] {
            let core_code = core_token::parse_token(text).unwrap_err().sqlstate();
            assert_eq!(parse_token(text).unwrap_err().sqlstate(), code);
            assert_eq!(core_code, code);
        }
        assert_eq!(parse_token(" 7 ").unwrap(), Some(7));
        assert_eq!(check_token(-1).unwrap_err().sqlstate(), "22023");
    }
}
