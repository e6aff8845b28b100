"""``python -m openenv_harness.cli``."""

from openenv_harness.cli.app import main

main()
