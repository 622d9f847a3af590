"""`python -m bench`: the benchmark suite (bench/suite.py), every figure of the benchmarks page (docs/benchmarks.md) in one run."""
import sys

from .suite import main

sys.exit(main())
