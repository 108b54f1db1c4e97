"""Runs test files under pytest: the `main` of every py_test target in BUILD."""

import sys

import pytest

if __name__ == "__main__":
  sys.exit(pytest.main(["-q", *sys.argv[1:]]))
