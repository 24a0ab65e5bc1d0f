"""One module per `tensor-tutor` subcommand; tutor/cli.py imports each only when it runs."""
