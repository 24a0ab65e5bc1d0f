"""The CLI's name for tutor.safe_text (the helpers moved below the CLI so the lesson loader can use them)."""

from tutor.safe_text import as_text, markup_safe, plain, without_controls

__all__ = ["as_text", "markup_safe", "plain", "without_controls"]
