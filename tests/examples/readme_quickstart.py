"""Runs the Python block of README.md's "From Python" section as it is written, so that the
README's quickstart stays true. Usage: readme_quickstart.py README.md (with the package
importable: PYTHONPATH=build/release/python or an installed onnxtrain)."""
import re
import sys


def main() -> None:
    readme = open(sys.argv[1], encoding="utf-8").read()
    section = readme.split("## From Python", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    if block is None:
        sys.exit("README.md: no ```python block in the 'From Python' section")
    exec(compile(block.group(1), "README.md (From Python)", "exec"), {"__name__": "__main__"})


if __name__ == "__main__":
    main()
