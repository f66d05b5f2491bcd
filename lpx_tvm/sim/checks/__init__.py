"""The schedule checks, one module per unit kind.

Each module holds what the simulator checks for its unit's instructions and the state
those checks need: ``mem`` (SRAM accesses, through the race stamps of ``sim/memory.py``),
``dma``, ``mxm`` (weight buffers, accumulator rows, float blocks), ``vxm``, ``sxm``,
``c2c`` (links), ``icu`` (sync, NOPs); ``streams`` (stream values as space-time
intervals), ``ports`` (unit occupancy) and ``operands`` (the static field checks) apply
to every instruction. A unit's ``HANDLERS`` map each of its opcodes to a function
``(run, i, ins, timing, done_before)`` that checks instruction ``i`` against the
state, updates it and records the instruction's step with ``run.record``
(``simulator._Run`` drives them in issue order).
"""
