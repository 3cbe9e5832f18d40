"""One module per `dsprune` subcommand: an `Args` dataclass and `run(args)`."""
