import sys

from chunkmaster.cli.main import main

sys.exit(main())
