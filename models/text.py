"""Unicode rules for text Reverie stores, wherever it comes from (ingest, a model's answer).

Text is NFC-normalised, and what no back-end stores faithfully is refused rather than
repaired: a NUL (PostgreSQL refuses it in text, SQLite keeps it and cuts strings at
it elsewhere) and an unpaired surrogate (not Unicode: it cannot be encoded, so the
tokenizer and both drivers fail on it). Repairing would store words nobody wrote.
"""

from __future__ import annotations

import unicodedata

# Bidirectional overrides and isolates: they make text display in another order than
# it is stored, so a summary could read differently from what was checked.
BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def clean_text(text: str) -> str:
    """``text`` NFC-normalised; ValueError if it holds a NUL or an unpaired surrogate."""
    if "\x00" in text:
        raise ValueError("contains a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("contains an unpaired surrogate (not valid Unicode)") from None
    return unicodedata.normalize("NFC", text)


def refuse_controls(text: str) -> str:
    """``text`` unchanged; ValueError if it holds a control character other than
    whitespace (an escape sequence, a bell, DEL, a C1 control) or a bidi override.

    Stricter than ingest needs to be: a model's answer has no reason to hold any."""
    for ch in text:
        if ch in BIDI_CONTROLS or (unicodedata.category(ch) == "Cc" and not ch.isspace()):
            raise ValueError(f"contains a control character (U+{ord(ch):04X})")
    return text


# Character classes that make text visible: letters, numbers, punctuation, symbols.
# Marks (a lone combining accent), spaces, controls and format characters do not.
_VISIBLE_CATEGORIES = frozenset("LNPS")


def has_visible_text(text: str) -> bool:
    """Whether ``text`` shows anything: a letter, number, punctuation mark or symbol."""
    return any(unicodedata.category(ch)[0] in _VISIBLE_CATEGORIES for ch in text)
