"""Renderers: a report dict (locus.report) to text, JSON, CSV or Markdown."""

from locus.render import tables
from locus.render.formats import render

__all__ = ["render", "tables"]
