"""``python -m hybrid.cli VERB ...``: the ``hybrid`` command, for tests and for Lightning's DDP launcher,
which starts every further process by rerunning the command line it was given."""

from hybrid.cli import main

main()
