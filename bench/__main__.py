"""`python -m bench`: the benchmark suite (bench/suite.py), every figure of the README's performance table in one run."""
import sys

from .suite import main

sys.exit(main())
