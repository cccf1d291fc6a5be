import sys

from gpumedic.cli import main

sys.exit(main())
