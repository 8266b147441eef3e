"""Benchmarks of agentstate against raw apsw (the floor) and peer stores.

Run ``python -m benchmarks.run`` from the repository root; see
:mod:`benchmarks.run` for the options and what is measured.
"""
