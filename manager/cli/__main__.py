import sys

from manager.cli.main import main

sys.exit(main())
