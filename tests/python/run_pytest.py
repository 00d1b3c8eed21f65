"""Runs one test file under pytest for ctest (tests/python/CMakeLists.txt).

Without pytest (Debian's python3-pytest, which `bash run.sh test` installs) the file
cannot run at all: exit 77, which ctest reports as Skipped, with the fix in the output,
rather than a failure that reads like a broken test.
"""
import sys

try:
    import pytest
except ImportError:
    print(f"SKIPPED {sys.argv[1]}: pytest is not installed for {sys.executable} "
          "(apt-get install python3-pytest; `bash run.sh test` installs it)")
    sys.exit(77)

sys.exit(pytest.main(["-q", "-rs", "-p", "no:cacheprovider", *sys.argv[1:]]))
