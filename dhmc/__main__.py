import sys

from dhmc.cli import main

sys.exit(main())
