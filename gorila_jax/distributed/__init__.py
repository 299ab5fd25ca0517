"""Distribution: the program graph, its launchers, placement and multi-host jobs."""
