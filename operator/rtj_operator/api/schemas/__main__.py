"""`python -m rtj_operator.api.schemas [--from-openapi PATH] [--check]`."""

from rtj_operator.api.schemas.openapi import main

raise SystemExit(main())
