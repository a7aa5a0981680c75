"""``%gpuinfo``: the hardware and software this kernel really has."""

from __future__ import annotations

from typing import TYPE_CHECKING

from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from ipycloud.magics._arguments import help_option, parse_line

if TYPE_CHECKING:
    from ipycloud.runtime.machine.report import EnvironmentReport, JsonReport


@magics_class
class GpuInfoMagics(Magics):
    """Report the platform, CPU, RAM, disks, GPUs and deep-learning software."""

    @help_option
    @magic_arguments()
    @argument("--json", action="store_true",
              help="return the full report as JSON (a tree in JupyterLab) instead of a table")
    @argument("-p", "--processes", action="store_true",
              help="also list the processes holding memory on each GPU")
    @line_magic
    def gpuinfo(self, line: str = "") -> EnvironmentReport | JsonReport:
        """Show what this kernel really runs on.

        Reports the notebook platform (Colab, Kaggle, Paperspace, SageMaker, ...) with its
        persistent folder and session limits; the CPU, RAM and disk, with the container's
        own limits; every NVIDIA GPU visible to this process (CUDA_VISIBLE_DEVICES applies)
        with memory, utilisation, temperature, power, clocks, compute capability and MIG;
        the driver, torch, CUDA runtime, cuDNN, bf16 support, XLA/TPU and Apple MPS.

        GPUs are queried through NVML, so CUDA is never initialised in the kernel: a
        multi-GPU launch that forks still works afterwards. Fields the driver cannot give
        show as n/a. Without a GPU the report says so and shows the rest. torch is not
        imported for the report (that takes seconds): until the notebook imports it, its
        version, CUDA runtime and cuDNN are read from the installed files.

        Examples
        --------
        Show the report as a table::

            %gpuinfo

        Also list the processes using each GPU::

            %gpuinfo --processes

        Keep the data as a dict for your own code::

            info = %gpuinfo --json
            info.data["gpus"]["devices"][0]["memory_free"]
        """
        args = parse_line(self.gpuinfo, line)
        from ipycloud.runtime.machine.report import (  # probes load on use
            JsonReport,
            environment_report,
        )

        report = environment_report(processes=args.processes)
        return JsonReport(report) if args.json else report
