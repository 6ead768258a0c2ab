"""One module per stage, each reading and writing the run directory; stages stand on train/, export/ and core/,
never on each other."""
