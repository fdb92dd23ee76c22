"""``python -m mla_var3`` is the ``mla-var3`` command."""

from mla_var3.cli import main

raise SystemExit(main())
