"""Reversible escaping of framework ids into key characters, shared by the adapters.

Characters in ``keep`` stay; every other one becomes ``mark`` and two hex digits
per UTF-8 byte (lone surrogates too, so any Python str round-trips). Each
adapter keeps its own mark and hex case: they are part of ids already stored.
"""

from __future__ import annotations


def escape(text: str, keep: frozenset[str], mark: str, hexfmt: str = "02x") -> str:
    if all(ch in keep for ch in text):
        return text
    return "".join(
        ch if ch in keep else "".join(f"{mark}{b:{hexfmt}}" for b in ch.encode("utf-8", "surrogatepass"))
        for ch in text
    )


def unescape(text: str, mark: str) -> str:
    """The text ``escape`` was given (``text`` holds only ASCII)."""
    if mark not in text:
        return text
    out, i = bytearray(), 0
    while i < len(text):
        if text[i] == mark:
            out.append(int(text[i + 1:i + 3], 16))
            i += 3
        else:
            out += text[i].encode("ascii")
            i += 1
    return out.decode("utf-8", "surrogatepass")
