"""tensor-tutor's test suite, a package: its helpers import as `tests.<module>` (pytest puts the repository root
on sys.path for a package of tests), so no test edits sys.path."""
