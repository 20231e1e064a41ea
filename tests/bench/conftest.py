# The benchmarks are scripts with printed figures, not tests: keep pytest out of here.
collect_ignore_glob = ["*.py"]
