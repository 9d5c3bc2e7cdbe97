"""Example actors for the tests: loaded by the test settings, never by production."""
