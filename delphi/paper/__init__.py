"""The project's own write-up: `delphi paper build` renders paper/paper.md (and each edition's
paper.md) from its template and a study's compact data (`build`); the runs beyond the ladder under
the law alone, each against its own seal and beside an earlier recipe's law (`beyond`)."""
