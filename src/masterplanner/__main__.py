"""`python -m masterplanner` runs the CLI."""

from .cli import main

main()
