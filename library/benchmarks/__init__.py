"""Benchmarks, run from library/ as modules: ``python -m benchmarks.overhead`` (the template against plain
DDP and bare Lightning), ``benchmarks.data`` (the two data paths), ``benchmarks.sharding`` (DDP against FSDP) and
``benchmarks.step_cost`` (where a step's time goes). docs/performance.md holds their figures."""
