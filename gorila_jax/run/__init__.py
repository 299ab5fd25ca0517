"""Running an experiment: its config, the program it wires, elastic actors."""
