"""Object stores and moving data to them (the drain engine arrives with the drain issue)."""
