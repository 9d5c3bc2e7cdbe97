"""Micro-benchmarks: ``python -m bench [--quick] [--only NAME]``.

Each scenario compares a candidate with a baseline measured in the same run
(interleaved, median of several runs), so the ratio holds across machines.
Add one with ``@scenario(...)`` in ``bench/scenarios.py``.
"""
