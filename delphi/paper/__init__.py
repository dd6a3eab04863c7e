"""The project's own write-up: `delphi paper build` renders paper/paper.md (and each edition's
paper.md) from its template and a study's compact data (`build`, the numbers the text quotes in
`numbers`); `verify` checks every seal against the editions (`delphi.editions`)."""
