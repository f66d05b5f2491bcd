"""The LPX machine: its config and presets, the instruction set, the timing of every
instruction, programs and their binary and assembly forms. The compiler, the simulator,
the runtime and the tools all read it; it imports nothing of theirs."""
