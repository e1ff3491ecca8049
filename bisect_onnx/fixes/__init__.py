"""From the culprit to a fix: candidate changes applied to a copy and checked by a rerun."""
