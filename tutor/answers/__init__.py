"""One answer per question, below every front end (the CLI, the app, the lessons' calculators and labs):
does a model fit (fit, with the fields it takes: fields), how long its step takes (time), and every picture
as data (pictures). No click, Rich widgets or Textual here."""
