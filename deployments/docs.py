"""Blocks of the README that code writes: each between ``<!-- generated:NAME -->`` and
``<!-- /generated:NAME -->``, replaced whole, the text around it left as it is."""

from __future__ import annotations

import re


def replace_block(text: str, name: str, body: str) -> str:
    """``text`` with its ``name`` block's lines replaced by ``body``; a block the text
    lacks is an error (a marker deleted by hand should not silently stop the check)."""
    pattern = re.compile(
        rf"(<!-- generated:{re.escape(name)} -->\n).*?(<!-- /generated:{re.escape(name)} -->)",
        re.S)
    if not pattern.search(text):
        raise ValueError(f"no <!-- generated:{name} --> ... <!-- /generated:{name} --> block")
    return pattern.sub(lambda m: m.group(1) + body.rstrip("\n") + "\n" + m.group(2), text,
                       count=1)
