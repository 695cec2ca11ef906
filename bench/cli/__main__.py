import sys

from acbench.cli import main

sys.exit(main())
