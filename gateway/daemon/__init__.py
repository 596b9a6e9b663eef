"""The daemon: the services of one mount, built in one place; its control socket, status,
metrics and preemption watch."""
