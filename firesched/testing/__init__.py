"""Tools for testing schedules and atoms: one-atom microkernels (``microkernel``)."""
