//! Decoding: the bytes each token stands for, and a streaming decoder that hands out text as
//! soon as it forms whole UTF-8 characters.

use super::{Decoding, Tokenizer};
use crate::error::{IoError, Result};

/// What one token decodes to.
#[derive(Debug, Clone)]
pub(crate) struct Piece {
    bytes: Box<[u8]>,
    /// Left out by `decode(.., skip_special = true)`.
    special: bool,
}

impl Piece {
    pub(crate) fn new(bytes: impl Into<Box<[u8]>>, special: bool) -> Piece {
        Piece {
            bytes: bytes.into(),
            special,
        }
    }

    pub(crate) fn empty() -> Piece {
        Piece::new(Vec::new(), false)
    }
}

/// The bytes of every token, plus how many leading spaces of the whole text to drop (the
/// dummy prefix space SentencePiece adds when encoding).
#[derive(Debug, Clone)]
pub(crate) struct PieceTable {
    pieces: Vec<Piece>,
    strip_leading_spaces: usize,
}

impl PieceTable {
    pub(crate) fn new(pieces: Vec<Piece>, strip_leading_spaces: usize) -> PieceTable {
        PieceTable {
            pieces,
            strip_leading_spaces,
        }
    }

    pub(crate) fn strip_leading_spaces(&self) -> usize {
        self.strip_leading_spaces
    }

    /// Appends the bytes of token `id` (checked by the caller) to `out`. `strip` counts the
    /// leading spaces still to drop; it is reset to 0 by the first byte that is not a space.
    pub(crate) fn append(&self, id: u32, skip_special: bool, strip: &mut usize, out: &mut Vec<u8>) {
        let Some(piece) = self.pieces.get(id as usize) else {
            return;
        };
        if skip_special && piece.special {
            return;
        }
        let mut bytes = &piece.bytes[..];
        while *strip > 0 {
            match bytes.split_first() {
                Some((b' ', rest)) => {
                    bytes = rest;
                    *strip -= 1;
                }
                Some(_) => *strip = 0,
                None => break,
            }
        }
        out.extend_from_slice(bytes);
    }
}

/// Moves the complete UTF-8 text at the start of `pending` into a `String`, keeping an
/// incomplete character at the end for later. Invalid sequences become U+FFFD exactly as
/// `String::from_utf8_lossy` would make them in the whole text, so the chunks of a stream add
/// up to the lossy decoding of all its bytes.
fn drain_complete(pending: &mut Vec<u8>) -> String {
    let mut out = String::new();
    let mut rest: &[u8] = pending;
    loop {
        match std::str::from_utf8(rest) {
            Ok(text) => {
                out.push_str(text);
                rest = &[];
                break;
            }
            Err(error) => {
                let (valid, after) = rest.split_at(error.valid_up_to());
                out.push_str(&String::from_utf8_lossy(valid));
                match error.error_len() {
                    Some(len) => {
                        out.push(char::REPLACEMENT_CHARACTER);
                        rest = &after[len..];
                    }
                    None => {
                        rest = after;
                        break;
                    }
                }
            }
        }
    }
    let kept = rest.len();
    let start = pending.len() - kept;
    pending.drain(..start);
    out
}

fn non_empty(text: String) -> Option<String> {
    (!text.is_empty()).then_some(text)
}

/// Turns token ids pushed one at a time into text, for printing a model's output as it is
/// generated.
///
/// [`StreamDecoder::push`] returns the text completed by the new id, holding back the bytes of
/// a UTF-8 character that later tokens finish (an emoji spread over byte-fallback or
/// byte-level tokens); [`StreamDecoder::flush`] returns what is left at the end. The chunks
/// concatenated equal [`Tokenizer::decode`] of all pushed ids with the same `skip_special`.
#[derive(Debug)]
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    skip_special: bool,
    state: State,
}

#[derive(Debug)]
enum State {
    Pieces {
        pending: Vec<u8>,
        strip: usize,
    },
    /// Prefix-difference decoding through the library decoder: `ids[prefix..read]` was decoded
    /// last time, `ids[read..]` is new.
    Library {
        ids: Vec<u32>,
        prefix: usize,
        read: usize,
    },
}

impl<'a> StreamDecoder<'a> {
    pub(crate) fn new(tokenizer: &'a Tokenizer, skip_special: bool) -> StreamDecoder<'a> {
        let state = match &tokenizer.decoding {
            Decoding::Pieces(table) => State::Pieces {
                pending: Vec::new(),
                strip: table.strip_leading_spaces(),
            },
            Decoding::Library => State::Library {
                ids: Vec::new(),
                prefix: 0,
                read: 0,
            },
        };
        StreamDecoder {
            tokenizer,
            skip_special,
            state,
        }
    }

    /// Adds one id; returns the text it completes, if any. Ids outside the vocabulary give
    /// [`IoError::TokenIdOutOfRange`] and leave the decoder as it was.
    pub fn push(&mut self, id: u32) -> Result<Option<String>> {
        self.tokenizer.check_id(id)?;
        match &mut self.state {
            State::Pieces { pending, strip } => {
                let Decoding::Pieces(table) = &self.tokenizer.decoding else {
                    return Err(IoError::Tokenizer("stream decoder out of sync".into()));
                };
                table.append(id, self.skip_special, strip, pending);
                Ok(non_empty(drain_complete(pending)))
            }
            State::Library { ids, prefix, read } => {
                ids.push(id);
                let before = self
                    .tokenizer
                    .library_decode(&ids[*prefix..*read], self.skip_special)?;
                let after = self
                    .tokenizer
                    .library_decode(&ids[*prefix..], self.skip_special)?;
                if after.len() > before.len()
                    && !after.ends_with(char::REPLACEMENT_CHARACTER)
                    && after.starts_with(&before)
                {
                    *prefix = *read;
                    *read = ids.len();
                    Ok(Some(after[before.len()..].to_string()))
                } else {
                    Ok(None)
                }
            }
        }
    }

    /// Returns the text still held back (an unfinished character becomes U+FFFD) and resets
    /// the decoder for a new stream.
    pub fn flush(&mut self) -> Result<Option<String>> {
        let text = match &mut self.state {
            State::Pieces { pending, .. } => {
                let text = String::from_utf8_lossy(pending).into_owned();
                pending.clear();
                text
            }
            State::Library { ids, prefix, read } => {
                let before = self
                    .tokenizer
                    .library_decode(&ids[*prefix..*read], self.skip_special)?;
                let after = self
                    .tokenizer
                    .library_decode(&ids[*prefix..], self.skip_special)?;
                let text = after
                    .strip_prefix(before.as_str())
                    .unwrap_or(after.as_str())
                    .to_string();
                text
            }
        };
        *self = StreamDecoder::new(self.tokenizer, self.skip_special);
        Ok(non_empty(text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (xorshift) for the byte soup below.
    fn next(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    #[test]
    fn streamed_chunks_equal_lossy_decoding_of_the_whole() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let samples: [&[u8]; 6] = [
            "héllo wörld".as_bytes(),
            "日本語テキスト".as_bytes(),
            "🙂👍🏽 emoji".as_bytes(),
            &[0xF0, 0x9F, 0x99],       // truncated emoji
            &[0xC3, 0x28, 0xA0, 0xA1], // invalid continuation bytes
            &[0xE2, 0x82, 0xF0, 0x9F, 0x98, 0x80, 0xFF],
        ];
        for round in 0..400 {
            // Random concatenation of samples and random bytes, cut at random points.
            let mut bytes = Vec::new();
            for _ in 0..(next(&mut seed) % 6) {
                if next(&mut seed).is_multiple_of(3) {
                    bytes.push(next(&mut seed) as u8);
                } else {
                    bytes.extend_from_slice(samples[(next(&mut seed) % 6) as usize]);
                }
            }
            let mut pending = Vec::new();
            let mut streamed = String::new();
            let mut i = 0;
            while i < bytes.len() {
                let n = 1 + (next(&mut seed) % 4) as usize;
                let end = (i + n).min(bytes.len());
                pending.extend_from_slice(&bytes[i..end]);
                streamed.push_str(&drain_complete(&mut pending));
                i = end;
            }
            streamed.push_str(&String::from_utf8_lossy(&pending));
            assert_eq!(
                streamed,
                String::from_utf8_lossy(&bytes),
                "round {round}: {bytes:02x?}"
            );
        }
    }

    #[test]
    fn incomplete_character_is_held_back() {
        let mut pending = vec![0xF0, 0x9F];
        assert_eq!(drain_complete(&mut pending), "");
        assert_eq!(pending, [0xF0, 0x9F]);
        pending.extend_from_slice(&[0x99, 0x82, b'!']);
        assert_eq!(drain_complete(&mut pending), "🙂!");
        assert!(pending.is_empty());
    }

    #[test]
    fn leading_spaces_are_stripped_once() {
        let table = PieceTable::new(
            vec![
                Piece::new(b"<s>".to_vec(), true),
                Piece::new(b" hi".to_vec(), false),
                Piece::new(b" ".to_vec(), false),
            ],
            1,
        );
        let run = |ids: &[u32], skip: bool| {
            let mut out = Vec::new();
            let mut strip = table.strip_leading_spaces();
            for &id in ids {
                table.append(id, skip, &mut strip, &mut out);
            }
            String::from_utf8(out).unwrap()
        };
        assert_eq!(run(&[1, 1], false), "hi hi");
        assert_eq!(run(&[0, 1], true), "hi");
        assert_eq!(run(&[0, 1], false), "<s> hi");
        assert_eq!(run(&[2, 1], false), " hi");
    }
}
