"""`python -m actors.cli ...`: the `aqueduct` command without its console script (as
`python -m actors.cli.main ...`)."""

from actors.cli.main import entry_point

entry_point()
