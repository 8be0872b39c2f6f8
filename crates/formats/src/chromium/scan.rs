//! A pull scanner for JSON read from a stream in large blocks, for traces too large to hold.
//!
//! The caller walks the document (`begin_object`, `next_key`, `next_element`, `string`, `number`,
//! `skip_value`); the scanner never builds a tree and copies only the strings the caller asks for.
//! Every error carries the absolute byte offset of the problem. Limits keep hostile input bounded:
//! strings the caller keeps are at most [`MAX_STRING`] bytes, nesting is at most [`MAX_DEPTH`] deep,
//! numbers are at most [`MAX_NUMBER`] characters.

use std::io::{ErrorKind, Read};

pub use super::decimal::Decimal;
use crate::error::{FormatError, Position};

/// Bytes read from the input at a time.
const BLOCK: usize = 1 << 20;
/// Longest string value the scanner copies out (longer ones are an error).
pub const MAX_STRING: usize = 1 << 20;
/// Deepest nesting of arrays and objects accepted.
pub const MAX_DEPTH: usize = 128;
/// Longest number token accepted, in characters.
pub const MAX_NUMBER: usize = 64;

/// What a value in the document is, judged by its first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `{`
    Object,
    /// `[`
    Array,
    /// `"`
    String,
    /// `-` or a digit.
    Number,
    /// `true`, `false`.
    Bool,
    /// `null`.
    Null,
}

/// The scanner. See the module documentation.
pub struct Scanner<R> {
    reader: R,
    buf: Box<[u8]>,
    pos: usize,
    end: usize,
    base: u64,
    eof: bool,
    depth: usize,
    /// The last string or key read by [`Scanner::string`] / [`Scanner::next_key`].
    pub text: String,
    /// Bytes of the string being read (swapped with `text` once checked, to reuse both buffers).
    raw: Vec<u8>,
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\r' | b'\t')
}

impl<R: Read> Scanner<R> {
    /// A scanner over `reader`.
    pub fn new(reader: R) -> Scanner<R> {
        Scanner {
            reader,
            buf: vec![0; BLOCK].into_boxed_slice(),
            pos: 0,
            end: 0,
            base: 0,
            eof: false,
            depth: 0,
            text: String::new(),
            raw: Vec::new(),
        }
    }

    /// Absolute byte offset of the next unread byte.
    pub fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    /// An error at the current offset.
    pub fn error(&self, message: impl Into<String>) -> FormatError {
        FormatError::invalid(Position::Byte(self.offset()), message)
    }

    fn refill(&mut self) -> Result<bool, FormatError> {
        if self.pos < self.end {
            return Ok(true);
        }
        if self.eof {
            return Ok(false);
        }
        self.base += self.end as u64;
        self.pos = 0;
        self.end = 0;
        loop {
            match self.reader.read(&mut self.buf) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(false);
                }
                Ok(n) => {
                    self.end = n;
                    return Ok(true);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Skips whitespace and returns the next byte without consuming it (`None` at the end).
    #[inline]
    pub fn peek(&mut self) -> Result<Option<u8>, FormatError> {
        loop {
            while self.pos < self.end {
                let b = self.buf[self.pos];
                if !is_ws(b) {
                    return Ok(Some(b));
                }
                self.pos += 1;
            }
            if !self.refill()? {
                return Ok(None);
            }
        }
    }

    fn unexpected(&self, found: Option<u8>, expected: &str) -> FormatError {
        match found {
            None => self.error(format!(
                "the input ends early (truncated JSON?): expected {expected}"
            )),
            Some(b) if b.is_ascii_graphic() => {
                self.error(format!("expected {expected}, found `{}`", b as char))
            }
            Some(b) => self.error(format!("expected {expected}, found byte 0x{b:02x}")),
        }
    }

    /// Consumes `byte` (after whitespace) or fails naming `expected`.
    #[inline]
    pub fn expect(&mut self, byte: u8, expected: &str) -> Result<(), FormatError> {
        match self.peek()? {
            Some(b) if b == byte => {
                self.pos += 1;
                Ok(())
            }
            other => Err(self.unexpected(other, expected)),
        }
    }

    /// The kind of the next value, without consuming it.
    pub fn kind(&mut self) -> Result<Kind, FormatError> {
        match self.peek()? {
            Some(b'{') => Ok(Kind::Object),
            Some(b'[') => Ok(Kind::Array),
            Some(b'"') => Ok(Kind::String),
            Some(b'-' | b'0'..=b'9') => Ok(Kind::Number),
            Some(b't' | b'f') => Ok(Kind::Bool),
            Some(b'n') => Ok(Kind::Null),
            other => Err(self.unexpected(other, "a JSON value")),
        }
    }

    fn enter(&mut self) -> Result<(), FormatError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.error(format!("JSON nested more than {MAX_DEPTH} levels deep")));
        }
        Ok(())
    }

    /// Consumes `{`.
    pub fn begin_object(&mut self) -> Result<(), FormatError> {
        self.expect(b'{', "`{` (an object)")?;
        self.enter()
    }

    /// Consumes `[`.
    pub fn begin_array(&mut self) -> Result<(), FormatError> {
        self.expect(b'[', "`[` (an array)")?;
        self.enter()
    }

    /// Moves to the next key of an object: `Ok(true)` with the key in [`Scanner::text`], or
    /// `Ok(false)` after consuming the closing `}`. `first` must start true for each object.
    pub fn next_key(&mut self, first: &mut bool) -> Result<bool, FormatError> {
        match self.peek()? {
            Some(b'}') => {
                self.pos += 1;
                self.depth -= 1;
                return Ok(false);
            }
            Some(b',') if !*first => self.pos += 1,
            other if *first => {
                if other != Some(b'"') {
                    return Err(self.unexpected(other, "a key or `}`"));
                }
            }
            other => return Err(self.unexpected(other, "`,` or `}`")),
        }
        *first = false;
        match self.peek()? {
            Some(b'"') => {}
            other => return Err(self.unexpected(other, "a key string")),
        }
        self.string()?;
        self.expect(b':', "`:` after a key")?;
        Ok(true)
    }

    /// Moves to the next element of an array: `Ok(true)` when one follows, `Ok(false)` after consuming
    /// the closing `]`. With `lenient_end`, the end of input (after an element or a comma) also ends
    /// the array, as the trace-event format allows for traces cut short.
    pub fn next_element(
        &mut self,
        first: &mut bool,
        lenient_end: bool,
    ) -> Result<bool, FormatError> {
        match self.peek()? {
            Some(b']') => {
                self.pos += 1;
                self.depth -= 1;
                return Ok(false);
            }
            None if lenient_end => {
                self.depth -= 1;
                return Ok(false);
            }
            Some(b',') if !*first => {
                self.pos += 1;
                if lenient_end && self.peek()?.is_none() {
                    self.depth -= 1;
                    return Ok(false);
                }
            }
            Some(_) if *first => {}
            other => return Err(self.unexpected(other, "`,` or `]`")),
        }
        *first = false;
        Ok(true)
    }

    /// Reads a string value into [`Scanner::text`] (unescaped, checked UTF-8).
    pub fn string(&mut self) -> Result<(), FormatError> {
        self.expect(b'"', "a string")?;
        let start = self.offset();
        self.raw.clear();
        loop {
            if self.pos >= self.end && !self.refill()? {
                return Err(self.unexpected(None, "the end of a string"));
            }
            let window = &self.buf[self.pos..self.end];
            let stop = memchr::memchr2(b'"', b'\\', window).unwrap_or(window.len());
            if self.raw.len() + stop > MAX_STRING {
                return Err(FormatError::invalid(
                    Position::Byte(start),
                    format!("a string longer than {} MiB", MAX_STRING >> 20),
                ));
            }
            self.raw.extend_from_slice(&window[..stop]);
            self.pos += stop;
            if self.pos >= self.end {
                continue;
            }
            if self.buf[self.pos] == b'"' {
                self.pos += 1;
                break;
            }
            self.pos += 1;
            self.escape()?;
        }
        if self.raw.iter().any(|&b| b < 0x20) {
            return Err(FormatError::invalid(
                Position::Byte(start),
                "a control character inside a string must be escaped",
            ));
        }
        match String::from_utf8(std::mem::take(&mut self.raw)) {
            Ok(text) => {
                self.raw = std::mem::replace(&mut self.text, text).into_bytes();
                Ok(())
            }
            Err(e) => Err(FormatError::invalid(
                Position::Byte(start + e.utf8_error().valid_up_to() as u64),
                "a string is not valid UTF-8",
            )),
        }
    }

    /// The string read last (after [`Scanner::string`] or [`Scanner::next_key`]).
    pub fn text_str(&self) -> &str {
        &self.text
    }

    fn byte(&mut self) -> Result<u8, FormatError> {
        if self.pos >= self.end && !self.refill()? {
            return Err(self.unexpected(None, "more of a string"));
        }
        let b = self.buf[self.pos];
        self.pos += 1;
        Ok(b)
    }

    fn hex4(&mut self) -> Result<u32, FormatError> {
        let mut v = 0u32;
        for _ in 0..4 {
            let b = self.byte()?;
            let digit = (b as char)
                .to_digit(16)
                .ok_or_else(|| self.error("`\\u` must be followed by four hex digits"))?;
            v = v * 16 + digit;
        }
        Ok(v)
    }

    /// Decodes one escape (the backslash is consumed) into `text`.
    fn escape(&mut self) -> Result<(), FormatError> {
        let b = self.byte()?;
        let c = match b {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let hi = self.hex4()?;
                let code = if (0xD800..0xDC00).contains(&hi) {
                    if self.byte()? != b'\\' || self.byte()? != b'u' {
                        return Err(self.error("a UTF-16 high surrogate without its low half"));
                    }
                    let lo = self.hex4()?;
                    if !(0xDC00..0xE000).contains(&lo) {
                        return Err(self.error("a UTF-16 high surrogate without its low half"));
                    }
                    0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                } else {
                    hi
                };
                char::from_u32(code).ok_or_else(|| self.error("a lone UTF-16 surrogate"))?
            }
            _ => return Err(self.error("an unknown escape in a string")),
        };
        let mut utf8 = [0u8; 4];
        self.raw
            .extend_from_slice(c.encode_utf8(&mut utf8).as_bytes());
        Ok(())
    }

    /// Skips a string value without keeping it.
    fn skip_string(&mut self) -> Result<(), FormatError> {
        self.expect(b'"', "a string")?;
        loop {
            if self.pos >= self.end && !self.refill()? {
                return Err(self.unexpected(None, "the end of a string"));
            }
            let window = &self.buf[self.pos..self.end];
            match memchr::memchr2(b'"', b'\\', window) {
                None => self.pos = self.end,
                Some(i) => {
                    let quote = window[i] == b'"';
                    self.pos += i + 1;
                    if quote {
                        return Ok(());
                    }
                    self.byte()?;
                }
            }
        }
    }

    /// Reads a number token.
    pub fn number(&mut self) -> Result<Decimal, FormatError> {
        self.peek()?;
        let start = self.offset();
        let mut token = [0u8; MAX_NUMBER];
        let mut len = 0;
        loop {
            if self.pos >= self.end && !self.refill()? {
                break;
            }
            let b = self.buf[self.pos];
            if !matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E') {
                break;
            }
            if len == MAX_NUMBER {
                return Err(FormatError::invalid(
                    Position::Byte(start),
                    format!("a number longer than {MAX_NUMBER} characters"),
                ));
            }
            token[len] = b;
            len += 1;
            self.pos += 1;
        }
        Decimal::parse(&token[..len])
            .ok_or_else(|| FormatError::invalid(Position::Byte(start), "a malformed number"))
    }

    /// Reads a number, or a string holding a number (`"ts": "1234"`), as some producers write.
    pub fn number_or_numeric_string(&mut self, what: &str) -> Result<Decimal, FormatError> {
        match self.kind()? {
            Kind::Number => self.number(),
            Kind::String => {
                let at = self.offset();
                self.string()?;
                Decimal::parse(self.text.as_bytes().trim_ascii()).ok_or_else(|| {
                    FormatError::invalid(
                        Position::Byte(at),
                        format!(
                            "{what} must be a number, found {:?}",
                            shorten(self.text_str())
                        ),
                    )
                })
            }
            _ => Err(self.error(format!("{what} must be a number"))),
        }
    }

    fn literal(&mut self, word: &[u8]) -> Result<(), FormatError> {
        self.peek()?;
        for &expected in word {
            let at = self.offset();
            let b = if self.pos < self.end || self.refill()? {
                let b = self.buf[self.pos];
                self.pos += 1;
                Some(b)
            } else {
                None
            };
            if b != Some(expected) {
                return Err(FormatError::invalid(
                    Position::Byte(at),
                    format!(
                        "expected `{}`",
                        std::str::from_utf8(word).unwrap_or("a literal")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Reads `true`/`false`.
    pub fn boolean(&mut self) -> Result<bool, FormatError> {
        match self.peek()? {
            Some(b't') => self.literal(b"true").map(|()| true),
            Some(b'f') => self.literal(b"false").map(|()| false),
            other => Err(self.unexpected(other, "`true` or `false`")),
        }
    }

    /// Skips one whole value of any kind (iteratively, within the depth limit).
    pub fn skip_value(&mut self) -> Result<(), FormatError> {
        let floor = self.depth;
        // Each level remembers whether it is an object (keys) and whether it has had a member.
        let mut stack: Vec<(bool, bool)> = Vec::new();
        loop {
            match self.kind()? {
                Kind::Object => {
                    self.begin_object()?;
                    stack.push((true, false));
                }
                Kind::Array => {
                    self.begin_array()?;
                    stack.push((false, false));
                }
                Kind::String => self.skip_string()?,
                Kind::Number => {
                    self.number()?;
                }
                Kind::Bool => {
                    self.boolean()?;
                }
                Kind::Null => self.literal(b"null")?,
            }
            // Close finished containers and move to the next member.
            loop {
                let Some(&mut (object, ref mut started)) = stack.last_mut() else {
                    debug_assert_eq!(self.depth, floor);
                    return Ok(());
                };
                let mut first = !*started;
                *started = true;
                let more = if object {
                    self.next_key(&mut first)?
                } else {
                    self.next_element(&mut first, false)?
                };
                if more {
                    break;
                }
                stack.pop();
            }
        }
    }
}

/// The first 80 characters of `text`, for messages.
pub fn shorten(text: &str) -> String {
    const LIMIT: usize = 80;
    match text.char_indices().nth(LIMIT) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(text: &str) -> Scanner<&[u8]> {
        Scanner::new(text.as_bytes())
    }

    #[test]
    fn skips_nested_values_and_reads_strings() {
        let mut s =
            scan(r#"{"a": [1, {"b": [true, null, "x\"y"]}, -2e3], "k": "\u00e9\ud83d\ude00"}"#);
        s.begin_object().unwrap();
        let mut first = true;
        assert!(s.next_key(&mut first).unwrap());
        assert_eq!(s.text_str(), "a");
        s.skip_value().unwrap();
        assert!(s.next_key(&mut first).unwrap());
        assert_eq!(s.text_str(), "k");
        s.string().unwrap();
        assert_eq!(s.text_str(), "é😀");
        assert!(!s.next_key(&mut first).unwrap());
        assert_eq!(s.peek().unwrap(), None);
    }

    #[test]
    fn errors_carry_byte_offsets() {
        let deep = "[".repeat(200);
        let mut s = scan(&deep);
        let err = s.skip_value().unwrap_err().to_string();
        assert!(err.starts_with("byte offset 129:"), "{err}");
        let mut s = scan(r#"{"a": tru}"#);
        s.begin_object().unwrap();
        let mut first = true;
        s.next_key(&mut first).unwrap();
        let err = s.skip_value().unwrap_err().to_string();
        assert!(err.starts_with("byte offset 9:"), "{err}");
        let mut s = scan("\"abc");
        assert!(s.string().unwrap_err().to_string().contains("ends early"));
    }
}
