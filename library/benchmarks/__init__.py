"""Benchmarks, run from library/ as modules: ``python -m benchmarks.overhead`` (the template against plain
DDP and bare Lightning), ``benchmarks.data`` (the two data paths), ``benchmarks.sharding`` (DDP against FSDP) and
``benchmarks.step_cost`` (where a step's time goes). docs/performance.md holds their figures."""

from trainfleet import program

# They measure the template's own project (its configs, its LightningModule), built in their processes too.
program.serve("project", "project.module.ClassificationModule")
