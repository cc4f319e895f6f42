"""`python -m rtj_operator`: run the operator (the same as `rtj run`)."""

import sys

from rtj_operator.main import main

sys.exit(main())
