import sys

from connectors.meshtool.mcp import main

sys.exit(main())
