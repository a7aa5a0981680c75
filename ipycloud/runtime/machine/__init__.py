"""What this machine is: platform, cgroup limits, NVML GPUs, software, the environment report.

May import only the shared helpers of ``ipycloud.runtime``.
"""
