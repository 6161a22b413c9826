import sys

from pagedkube.cli import main

sys.exit(main())
