//! Counting a request header's lines and bytes as they arrive, before Pingora parses it: a
//! header with more fields than `server.max_headers` or more bytes than
//! `server.max_header_bytes` is answered 431 at once. (Pingora's own parser refuses more than 256
//! fields with a bare 400 and no hook, and would buffer up to a MiB first.) Pure.

/// What the bytes so far say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watch {
    /// The header goes on.
    Reading,
    /// The blank line that ends the header was seen; bytes after it are not the header's.
    Complete,
    /// Past a limit.
    TooLarge,
}

#[derive(Debug, Clone, Copy)]
pub struct HeaderWatch {
    max_lines: u32,
    max_bytes: u32,
    lines: u32,
    bytes: u32,
    /// Bytes of the current line, not counting `\r`.
    line_len: u32,
    done: bool,
}

impl HeaderWatch {
    /// `max_fields` header fields after the request line, `max_bytes` in all.
    pub fn new(max_fields: usize, max_bytes: usize) -> HeaderWatch {
        HeaderWatch {
            max_lines: u32::try_from(max_fields)
                .unwrap_or(u32::MAX)
                .saturating_add(1),
            max_bytes: u32::try_from(max_bytes).unwrap_or(u32::MAX),
            lines: 0,
            bytes: 0,
            line_len: 0,
            done: false,
        }
    }

    /// Whether the last header seen is complete (the next bytes start another request).
    pub fn is_complete(&self) -> bool {
        self.done
    }

    /// Starts over for the next request's header.
    pub fn reset(&mut self) {
        *self = HeaderWatch::new(0, 0).with_limits(self.max_lines, self.max_bytes);
    }

    fn with_limits(mut self, max_lines: u32, max_bytes: u32) -> HeaderWatch {
        self.max_lines = max_lines;
        self.max_bytes = max_bytes;
        self
    }

    /// Takes the next bytes read from the connection. Line ends are found with `memchr`; a
    /// `\r` before a line end does not count towards the line (a line of just `\r` is blank).
    pub fn feed(&mut self, data: &[u8]) -> Watch {
        if self.done {
            return Watch::Complete;
        }
        let mut start = 0;
        for end in memchr::memchr_iter(b'\n', data) {
            let line = &data[start..end];
            let len =
                self.line_len as usize + line.len() - usize::from(line.last() == Some(&b'\r'));
            self.bytes = self.bytes.saturating_add(as_u32(end + 1 - start));
            if len == 0 && self.lines > 0 {
                self.done = true;
                return if self.bytes > self.max_bytes {
                    Watch::TooLarge
                } else {
                    Watch::Complete
                };
            }
            self.lines += 1;
            self.line_len = 0;
            if self.lines > self.max_lines || self.bytes > self.max_bytes {
                return Watch::TooLarge;
            }
            start = end + 1;
        }
        let rest = &data[start..];
        self.bytes = self.bytes.saturating_add(as_u32(rest.len()));
        // A `\r` at the end of a read may be the first half of a line end.
        let counted = rest.len() - usize::from(rest.last() == Some(&b'\r'));
        self.line_len = self.line_len.saturating_add(as_u32(counted));
        if self.bytes > self.max_bytes {
            return Watch::TooLarge;
        }
        Watch::Reading
    }
}

fn as_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(fields: usize) -> Vec<u8> {
        let mut r = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..fields {
            r.extend_from_slice(format!("x-h{i}: v\r\n").as_bytes());
        }
        r.extend_from_slice(b"\r\nBODY\n\n\n");
        r
    }

    #[test]
    fn fields_are_counted_up_to_the_blank_line() {
        let mut w = HeaderWatch::new(100, 32 * 1024);
        assert_eq!(w.feed(&request(100)), Watch::Complete);
        let mut w = HeaderWatch::new(100, 32 * 1024);
        assert_eq!(w.feed(&request(101)), Watch::TooLarge);
        // Byte by byte, and with bare newlines.
        let mut w = HeaderWatch::new(2, 1024);
        for &b in b"GET / HTTP/1.1\na: 1\nb: 2\n" {
            assert_eq!(w.feed(&[b]), Watch::Reading);
        }
        assert_eq!(w.feed(b"\n"), Watch::Complete);
        assert!(w.is_complete());
        assert_eq!(w.feed(b"c: 3\n"), Watch::Complete, "after the header");
        w.reset();
        assert_eq!(
            w.feed(b"GET / HTTP/1.1\na: 1\nb: 2\nc: 3\n"),
            Watch::TooLarge
        );
    }

    #[test]
    fn bytes_are_bounded() {
        let mut w = HeaderWatch::new(100, 64);
        assert_eq!(w.feed(&[b'a'; 64]), Watch::Reading);
        assert_eq!(w.feed(b"a"), Watch::TooLarge);
    }
}
