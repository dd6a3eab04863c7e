"""`delphi study`: the whole loop from one study file, resumably (the stages and their order are in
`delphi.study.stages` and docs/cli.md).

One module per concept: `spec` (the study file), `state` (a study directory and what the stages read
back from it), `store` (the corpus store a study is pinned to), `fitting` (the study's laws on its
table), `seeds` (a run's seeds trained side by side), `seal_identity` (whether a seal found at a
study's seal path is its own), `stages` (the stages in order and `run_study`), `report` (figures and
report.md), `pipeline_report` (`delphi report`), `snapshot` (compact copies), `commands` (`delphi study`, `delphi report`).
"""
