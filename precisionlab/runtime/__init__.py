"""The machine a run happens on: devices, threads, memory estimates, interrupts, versions, GPU timing."""
