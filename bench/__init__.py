"""The benchmark suite (`make bench`, `python -m bench`): see bench/suite.py."""
