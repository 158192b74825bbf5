"""bench/results.py's pieces: the row schema (schema.py), the suite files (suite.py), the runs' logs (logs.py,
derive.py), one module per benchmark family that needs its own reading (collectives, data, llama, cp) and the
generated docs/performance.md (page.py, suites.py)."""
