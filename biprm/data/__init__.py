"""The data wing: raw rows -> `Trajectory` -> token pieces -> Arrow or JSONL, and nothing of the model.

`readers` is the one door to a data source (files, the Hub, the synthetic task),
`template` the one place the text layout is written, `encoding` the one tokenisation
for both streams. Modules here import nothing of biprm outside this folder and
`biprm.config`, so everything above can rely on them and they on nothing above.
"""
