"""The comm advice's reading of source lines (no recording)."""

from __future__ import annotations

import pytest

from locus.analysis.comm import _promoted_field


class _Names:
    """What _promoted_field asks of the report's names: a site, and its source line."""

    def __init__(self, text: str):
        self.text = text

    def site(self, proc: int, ip: int) -> dict:
        return {"function": "wa", "file": "body.c", "line": 7}

    def source_text(self, proc: int, ip: int, line: int) -> str:
        return self.text if (proc, ip, line) == (1, 0x1130, 7) else ""


@pytest.mark.parametrize(
    "text,field",
    [
        ("  for (long i = 0; i < n; i++) { st->hits++; }", "st->hits"),
        ("  (*st).misses += k;", "st->misses"),
        ("  st [0] . hits = 0;", "st->hits"),
        ("  st->hits += st->hits;", "st->hits"),
        # two fields, another pointer's member, a member named like the pointer: none
        ("  st->hits += st->misses;", None),
        ("  other_st->hits++;", None),
        ("  p->st->hits++;", None),
        ("", None),
    ],
)
def test_a_promoted_part_is_the_field_its_busiest_line_names(text, field):
    """clang's `st.body.N` is the field of `*st` that its busiest access's line writes
    `st->FIELD` (or `(*st).FIELD`, `st[0].FIELD`) of, when the line names one field."""
    o = {"name": "st.body.0", "_top_ip": (1, 0x1130)}
    assert _promoted_field(o, "st", _Names(text)) == field
