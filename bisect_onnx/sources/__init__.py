"""Where a run starts: MODEL forms, input files, and random inputs drawn from a graph."""
