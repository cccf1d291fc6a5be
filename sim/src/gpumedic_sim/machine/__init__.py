"""What a simulated node answers, where its own interfaces would be: NVML, /proc, the kernel log,
the Docker engine, its SSH server and its peer daemon, all derived from one state (`state`)."""
