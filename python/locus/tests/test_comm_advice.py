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
    assert _promoted_field((1, 0x1130), "st", _Names(text)) == field


def test_a_lines_field_note_is_relative_to_its_own_object_only():
    """The text shows a field relative to the line's object (`.hits` of `sb`), and a field
    of the variable beside it whole, even where its name starts like the object's."""
    from locus.render.comm import _field_note

    assert _field_note(["sb.hits"], "sb") == " (.hits)"
    assert _field_note(["sb[1].hits", "sb[2].hits"], "sb") == " ([1].hits+)"
    assert _field_note(["sb2.hits"], "sb") == " (sb2.hits)"
    assert _field_note(["sa.misses"], "sb") == " (sa.misses)"
    assert _field_note([], "sb") == ""
