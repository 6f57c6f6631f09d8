"""Reading a UTF-8 text file a user named (a corpus, a prompts file, a trace), with the system's
reason in one line when it cannot be read. Torch-free."""

from __future__ import annotations


class UnreadableText(ValueError):
    """Why a text file cannot be read, in one line: the system's reason (no such file, a directory, not
    UTF-8, a NUL byte in the name, a name too long); the caller names the file and what it is."""


def read_text(path) -> str:
    """The whole text of the UTF-8 file at ``path``; :class:`UnreadableText` when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError as e:
        raise UnreadableText(e.strerror or str(e)) from None
    except ValueError as e:      # UnicodeDecodeError, or an embedded NUL byte in the name
        raise UnreadableText(str(e)) from None
