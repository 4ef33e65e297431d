"""`python -m hermes_store.cli`: the `hermes-store` command."""

from hermes_store.cli import main

main(prog_name="hermes-store")
