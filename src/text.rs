//! Fixed-size, NUL-terminated text buffers, as kept in shared memory (lock names, etcd keys,
//! status messages, statistics' names and origins): one way to write and read them.
#![forbid(unsafe_code)]

/// Copy `text` into `buf`, cut to `buf.len() - 1` bytes at a character boundary, NUL-terminated
/// (the rest of `buf` zeroed).
pub fn copy_in(buf: &mut [u8], text: &str) {
    let mut n = text.len().min(buf.len() - 1);
    while !text.is_char_boundary(n) {
        n -= 1;
    }
    buf[..n].copy_from_slice(&text.as_bytes()[..n]);
    buf[n..].fill(0);
}

/// The text in `buf`, up to its first NUL.
pub fn read_out(buf: &[u8]) -> String {
    let len = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..len]).into_owned()
}

/// Whether `buf` holds exactly `text` (compared in place, no copy).
pub fn equals(buf: &[u8], text: &str) -> bool {
    let want = text.as_bytes();
    want.len() < buf.len() && &buf[..want.len()] == want && buf[want.len()] == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_at_a_character_boundary_and_read_back() {
        let mut buf = [0xffu8; 6];
        copy_in(&mut buf, "abcdé"); // é is two bytes: 'abcd' fits with the NUL, é does not
        assert_eq!(read_out(&buf), "abcd");
        assert_eq!(buf[4..], [0, 0]);
        assert!(equals(&buf, "abcd"));
        assert!(!equals(&buf, "abc"));
        assert!(!equals(&buf, "abcdef"));
    }
}
