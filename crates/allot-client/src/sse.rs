//! Server-Sent Events, read line by line as the HTML standard reads them: `data` lines joined,
//! `id` and `event` kept, comments and `retry` passed over, lines ended by LF, CRLF or CR. Fed
//! bytes as they come (any chunking), it gives whole messages. Used by [`Client::watch`] and by
//! the load generator's watchers.
//!
//! [`Client::watch`]: crate::Client::watch

/// One message: what its fields said (`data: None` when it had no data line).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Message {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: Option<String>,
}

/// Reads messages out of the bytes it is fed.
#[derive(Debug, Default)]
pub struct Parser {
    /// Bytes of a line not ended yet.
    partial: Vec<u8>,
    /// Lines read and not yet made into messages.
    lines: std::collections::VecDeque<String>,
    /// The last byte fed was a CR: a LF right after it ends no second line.
    after_cr: bool,
    message: Message,
}

impl Parser {
    /// Takes the next bytes of the stream, in any chunks.
    pub fn feed(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            let after_cr = std::mem::replace(&mut self.after_cr, byte == b'\r');
            match byte {
                b'\n' if after_cr => {}
                b'\n' | b'\r' => {
                    let line = String::from_utf8_lossy(&self.partial).into_owned();
                    self.lines.push_back(line);
                    self.partial.clear();
                }
                _ => self.partial.push(byte),
            }
        }
    }

    /// The next whole message, if one has been fed.
    pub fn message(&mut self) -> Option<Message> {
        while let Some(line) = self.lines.pop_front() {
            if line.is_empty() {
                let mut message = std::mem::take(&mut self.message);
                if message == Message::default() {
                    continue;
                }
                // Each data line added itself and a LF: the last LF is not the data's.
                if let Some(data) = &mut message.data {
                    data.pop();
                }
                return Some(message);
            }
            let (field, value) = line.split_once(':').unwrap_or((&line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "data" => {
                    let data = self.message.data.get_or_insert_with(String::new);
                    data.push_str(value);
                    data.push('\n');
                }
                "id" if !value.contains('\0') => self.message.id = Some(value.to_owned()),
                "event" => self.message.event = Some(value.to_owned()),
                // Comments (`: heartbeat`), `retry` and unknown fields.
                _ => {}
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(id: Option<&str>, event: Option<&str>, data: Option<&str>) -> Message {
        Message { id: id.map(str::to_owned), event: event.map(str::to_owned), data: data.map(str::to_owned) }
    }

    #[test]
    fn messages_come_whole_whatever_the_chunks_and_line_ends() {
        let text = "id: 5\nevent: grant.granted\ndata: {\"a\":\ndata:1}\n\n: heartbeat\n\n: heartbeat\r\nid: 9\r\n\r\n\
                    data: x\rretry: 10\r\rother\n\n";
        // Fed whole, and byte by byte (a CR and its LF in different chunks).
        for chunks in [vec![text.as_bytes().to_vec()], text.bytes().map(|b| vec![b]).collect()] {
            let mut parser = Parser::default();
            let mut got = Vec::new();
            for chunk in chunks {
                parser.feed(&chunk);
                got.extend(std::iter::from_fn(|| parser.message()));
            }
            assert_eq!(
                got,
                [
                    message(Some("5"), Some("grant.granted"), Some("{\"a\":\n1}")),
                    message(Some("9"), None, None),
                    message(None, None, Some("x")),
                ]
            );
        }
    }

    #[test]
    fn a_message_not_ended_waits_for_its_blank_line() {
        let mut parser = Parser::default();
        parser.feed(b"id: 1\ndata: a\n");
        assert_eq!(parser.message(), None);
        parser.feed(b"\n");
        assert_eq!(parser.message(), Some(message(Some("1"), None, Some("a"))));
        parser.feed(b"data:\n\n");
        assert_eq!(parser.message(), Some(message(None, None, Some(""))));
        parser.feed(b"data:\ndata: b\n\n");
        assert_eq!(parser.message(), Some(message(None, None, Some("\nb"))));
    }
}
