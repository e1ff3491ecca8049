"""Finding the culprit: bisection by probes, local checks, classification."""
