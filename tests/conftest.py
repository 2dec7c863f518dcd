import os
import sys

# The test helpers (harness, workers) are imported by name, here and in the forked ranks.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
