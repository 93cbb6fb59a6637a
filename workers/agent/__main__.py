"""``python -m workers.agent --node NAME [--gpus N]``: run the node agent."""

import sys

from workers.agent.service import main

if __name__ == "__main__":
    sys.exit(main())
