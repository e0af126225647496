import sys

from dfim.cli import main

sys.exit(main())
