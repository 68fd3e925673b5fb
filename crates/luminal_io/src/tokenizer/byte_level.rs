//! GPT-2's byte-level alphabet: every byte 0..=255 is spelled as one printable character
//! (`bytes_to_unicode` of OpenAI's `encoder.py`), so a byte-level BPE vocabulary is plain text.
//! Printable Latin-1 bytes stand for themselves; the others (controls, space, …) map to
//! U+0100.. in order, e.g. space → `Ġ` (U+0120), newline → `Ċ` (U+010A).

/// Characters of the alphabet are below this code point.
const TABLE_LEN: usize = 0x100 + 68;

/// Whether byte `b` is spelled by itself.
fn is_self_spelled(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// `table[c]` is the byte that character `c` spells, for `c < TABLE_LEN`.
fn char_to_byte_table() -> &'static [Option<u8>; TABLE_LEN] {
    static TABLE: std::sync::OnceLock<[Option<u8>; TABLE_LEN]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = [None; TABLE_LEN];
        let mut next = 0x100usize;
        for b in 0..=255u8 {
            if is_self_spelled(b) {
                table[b as usize] = Some(b);
            } else {
                table[next] = Some(b);
                next += 1;
            }
        }
        table
    })
}

/// The bytes a byte-level token spells, or `None` if it has a character outside the alphabet.
pub(crate) fn token_bytes(token: &str) -> Option<Vec<u8>> {
    let table = char_to_byte_table();
    token
        .chars()
        .map(|c| table.get(c as usize).copied().flatten())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_matches_gpt2() {
        assert_eq!(token_bytes("Ġ"), Some(vec![b' ']));
        assert_eq!(token_bytes("Ċ"), Some(vec![b'\n']));
        assert_eq!(token_bytes("ĉ"), Some(vec![b'\t']));
        assert_eq!(token_bytes("Ā"), Some(vec![0]));
        assert_eq!(token_bytes("hello"), Some(b"hello".to_vec()));
        // "é" is C3 A9, spelled "Ã©".
        assert_eq!(token_bytes("Ã©"), Some(vec![0xC3, 0xA9]));
        // U+00AD (soft hyphen) is not self-spelled: it maps to U+0143.
        assert_eq!(token_bytes("Ń"), Some(vec![0xAD]));
        assert_eq!(token_bytes("日"), None);
        // All 256 bytes are reachable exactly once.
        let table = char_to_byte_table();
        let mut seen = [false; 256];
        for b in table.iter().flatten() {
            assert!(!seen[*b as usize]);
            seen[*b as usize] = true;
        }
        assert!(seen.iter().all(|s| *s));
    }
}
