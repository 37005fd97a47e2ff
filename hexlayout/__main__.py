"""``python -m hexlayout``: the command line (see :mod:`hexlayout.cli`)."""

from hexlayout.cli import main

raise SystemExit(main())
