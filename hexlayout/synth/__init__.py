"""Layout and instruction synthesis."""
