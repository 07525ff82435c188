"""Env construction (make.py: ids, your own envs, vector envs) and space handling (spaces.py;
their checkpoint records: space_records.py).

Import from the submodules: the CLI checks an env id before torch is imported.
"""
