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
    /// Bytes of a line not ended yet (a line cut between two feeds).
    partial: Vec<u8>,
    /// Messages read whole and not taken yet.
    ready: std::collections::VecDeque<Message>,
    /// The last byte fed was a CR: a LF right after it ends no second line.
    after_cr: bool,
    /// The message being read.
    message: Message,
}

impl Parser {
    /// Takes the next bytes of the stream, in any chunks. Each line is read where it lies in
    /// `bytes` (copied only when cut between two feeds), and applied to the message at once.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        if std::mem::take(&mut self.after_cr) && bytes[0] == b'\n' {
            bytes = &bytes[1..];
        }
        while let Some(end) = bytes.iter().position(|&b| b == b'\n' || b == b'\r') {
            if self.partial.is_empty() {
                self.line(&bytes[..end]);
            } else {
                // The line's start came in an earlier feed; its buffer is kept for the next one.
                let mut line = std::mem::take(&mut self.partial);
                line.extend_from_slice(&bytes[..end]);
                self.line(&line);
                line.clear();
                self.partial = line;
            }
            let cr = bytes[end] == b'\r';
            bytes = &bytes[end + 1..];
            if cr {
                match bytes.first() {
                    Some(b'\n') => bytes = &bytes[1..],
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
        }
        self.partial.extend_from_slice(bytes);
    }

    /// The next whole message, if one has been fed.
    pub fn message(&mut self) -> Option<Message> {
        self.ready.pop_front()
    }

    /// One line, without its end: a field of the message, or the blank line that ends it.
    fn line(&mut self, line: &[u8]) {
        if line.is_empty() {
            let mut message = std::mem::take(&mut self.message);
            if message == Message::default() {
                return;
            }
            // Each data line added itself and a LF: the last LF is not the data's.
            if let Some(data) = &mut message.data {
                data.pop();
            }
            self.ready.push_back(message);
            return;
        }
        let line = String::from_utf8_lossy(line);
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `testdata/sse.json`, the table of cases the Python client's and the dashboard's readers
    /// are tested against too: this reader is the reference.
    #[test]
    fn messages_come_as_the_shared_table_says_whatever_the_chunks() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/sse.json");
        let table: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let cases = table["cases"].as_array().unwrap();
        assert!(cases.len() > 10, "the table has its cases");
        let field = |value: &serde_json::Value, name: &str| value.get(name).and_then(|v| v.as_str()).map(str::to_owned);
        for case in cases {
            let why = case["why"].as_str().unwrap();
            let want: Vec<Message> = case["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| Message { id: field(m, "id"), event: field(m, "event"), data: field(m, "data") })
                .collect();
            let chunks: Vec<Vec<u8>> =
                case["chunks"].as_array().unwrap().iter().map(|c| c.as_str().unwrap().as_bytes().to_vec()).collect();
            let whole = chunks.concat();
            // As the table cuts it, whole, and a byte at a time.
            for chunks in [chunks, vec![whole.clone()], whole.iter().map(|b| vec![*b]).collect()] {
                let mut parser = Parser::default();
                let mut got = Vec::new();
                for chunk in chunks {
                    parser.feed(&chunk);
                    got.extend(std::iter::from_fn(|| parser.message()));
                }
                assert_eq!(got, want, "{why}");
            }
        }
    }
}
