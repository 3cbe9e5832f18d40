"""The benchmark scripts of this checkout. A package so that the scripts and the tests share ``benchmarks.grid``
(the reproduction grid) and ``benchmarks._common`` by import instead of loading each other by file path."""
