"""Everything Textual: the tutor app, its screens and widgets. Nothing outside tutor.ui (and the
`learn`/`serve` commands) imports this package."""
