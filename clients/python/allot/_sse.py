"""Server-Sent Events, read as the HTML standard reads them: ``data`` lines joined, ``id`` and
``event`` kept, comments and ``retry`` passed over, lines ended by LF, CRLF or CR. Fed bytes as
they come (any chunking), it gives whole messages. The Rust client's reader (``sse.rs``) is the
reference; ``testdata/sse.json`` holds the cases both, and the dashboard's, are tested against."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional


@dataclass
class Message:
    """What a message's fields said (``data`` is ``None`` when it had no data line)."""

    id: Optional[str] = None
    event: Optional[str] = None
    data: Optional[str] = None


class EventStream:
    """Reads messages out of the bytes it is fed."""

    def __init__(self) -> None:
        self._partial = bytearray()  # a line not ended yet
        self._after_cr = False  # the last byte was a CR: a LF right after it ends no second line
        self._message = Message()

    def feed(self, chunk: bytes) -> List[Message]:
        """Takes the next bytes of the stream; answers the messages they end."""
        messages = []
        for byte in chunk:
            after_cr, self._after_cr = self._after_cr, byte == 0x0D
            if byte == 0x0A and after_cr:
                continue
            if byte in (0x0A, 0x0D):
                message = self._line(self._partial.decode("utf-8", "replace"))
                self._partial.clear()
                if message is not None:
                    messages.append(message)
            else:
                self._partial.append(byte)
        return messages

    def _line(self, line: str) -> Optional[Message]:
        """Takes one line; answers the message a blank line ends, if it has a field."""
        if not line:
            message, self._message = self._message, Message()
            if message == Message():
                return None
            if message.data is not None:
                message.data = message.data[:-1]  # each data line added a LF: the last is not the data's
            return message
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._message.data = (self._message.data or "") + value + "\n"
        elif field == "id" and "\0" not in value:
            self._message.id = value
        elif field == "event":
            self._message.event = value
        return None
