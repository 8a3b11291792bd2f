// Server-Sent Events, read as the HTML standard reads them: `data` lines joined, `id` and `event`
// kept, comments and `retry` passed over, lines ended by LF, CRLF or CR. Fed text as it comes
// (any chunking), it gives whole messages. The Rust client's reader (`sse.rs`) is the reference:
// `testdata/sse.json` holds the cases both, and the Python client's, are tested against.

const blank = () => ({ id: null, event: null, data: null });

export class EventStream {
  #partial = ""; // a line not ended yet
  #afterCr = false; // the last character was a CR: a LF right after it ends no second line
  #message = blank();

  /** Takes the next text of the stream; answers the messages it ends. */
  feed(text) {
    const messages = [];
    for (const c of text) {
      const afterCr = this.#afterCr;
      this.#afterCr = c === "\r";
      if (c === "\n" && afterCr) continue;
      if (c === "\n" || c === "\r") {
        const message = this.#line(this.#partial);
        this.#partial = "";
        if (message) messages.push(message);
      } else {
        this.#partial += c;
      }
    }
    return messages;
  }

  /** Takes one line; answers the message a blank line ends, if it has a field. */
  #line(line) {
    if (line === "") {
      const message = this.#message;
      this.#message = blank();
      if (message.id === null && message.event === null && message.data === null) return null;
      // Each data line added a LF: the last is not the data's.
      if (message.data !== null) message.data = message.data.slice(0, -1);
      return message;
    }
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") this.#message.data = (this.#message.data ?? "") + value + "\n";
    else if (field === "id" && !value.includes("\0")) this.#message.id = value;
    else if (field === "event") this.#message.event = value;
    return null;
  }
}
