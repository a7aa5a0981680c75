"""One training process of an exported task: torchrun starts it on every node as
``python -m ipycloud.runtime.cluster.worker PAYLOAD``.

It loads the function and its arguments from the payload and runs them with
``run_under_torchrun``, which makes the process group from torchrun's environment.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ipycloud.runtime.cluster.function_file import PayloadError, load_payload
from ipycloud.runtime.train.distributed import run_under_torchrun


def main(argv: Sequence[str] | None = None) -> int:
    """Run the payload named in ``argv``; returns the exit status."""
    arguments = sys.argv[1:] if argv is None else list(argv)
    if len(arguments) != 1:
        print("usage: python -m ipycloud.runtime.cluster.worker PAYLOAD", file=sys.stderr)
        return 2
    try:
        fn, args, kwargs = load_payload(arguments[0])
    except (OSError, PayloadError) as error:
        print(f"ipycloud worker: {error}", file=sys.stderr)
        return 1
    run_under_torchrun(fn, *args, **kwargs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
