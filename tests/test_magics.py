"""``%gpuinfo`` on a real IPython shell."""

from __future__ import annotations

import json
import os

import pytest
from IPython.core.error import UsageError

from ipycloud.runtime.machine.report import EnvironmentReport, JsonReport


def rendered(shell, obj) -> dict[str, object]:
    """What Jupyter would receive for ``obj``: the shell's own display formatter."""
    data, _ = shell.display_formatter.format(obj)
    return data


def test_gpuinfo_without_gpu_renders_html_and_text(shell, board) -> None:
    board("no-driver")
    report = shell.run_line_magic("gpuinfo", "")
    assert isinstance(report, EnvironmentReport)
    data = rendered(shell, report)
    assert "<table" in data["text/html"] and "No NVIDIA GPU" in data["text/html"]
    text = data["text/plain"]
    assert text == str(report)
    assert "No NVIDIA GPU: NVML unavailable" in text
    for label in ("Platform", "CPU", "RAM", "Disk (working)", "torch", "XLA / TPU"):
        assert any(line.startswith(label) for line in text.splitlines()), label


def test_gpuinfo_text_is_aligned(shell, board) -> None:
    board("8xH100")
    text = rendered(shell, shell.run_line_magic("gpuinfo", ""))["text/plain"]
    summary = text.split("\n\n")[0].splitlines()
    value_columns = {len(line) - len(line.split("  ", 1)[1].lstrip()) for line in summary}
    assert len(value_columns) == 1  # every value starts in the same column
    table = text.split("GPUs\n", 1)[1].splitlines()
    assert len(table) == 9
    assert len({line.index("NVIDIA H100") for line in table[1:]}) == 1


def test_gpuinfo_json_is_the_full_data(shell, board) -> None:
    board("1xT4")
    result = shell.run_line_magic("gpuinfo", "--json")
    assert isinstance(result, JsonReport)
    data = rendered(shell, result)
    assert data["application/json"]["gpus"]["devices"][0]["name"] == "Tesla T4"
    parsed = json.loads(data["text/plain"])
    assert parsed["gpus"]["devices"][0]["memory_total"] == 15360 * 1024**2
    assert parsed["gpus"]["devices"][0]["processes"] is None  # not asked for
    assert parsed["host"]["cpu_logical"] == os.cpu_count()


def test_gpuinfo_processes_adds_the_process_table(shell, board) -> None:
    board("no-power-clocks")
    plain = str(shell.run_line_magic("gpuinfo", ""))
    with_processes = shell.run_line_magic("gpuinfo", "--processes")
    assert "GPU processes" not in plain
    assert "GPU processes" in str(with_processes)
    assert "<h4>GPU processes</h4>" in with_processes._repr_html_()
    short = shell.run_line_magic("gpuinfo", "-p --json")
    assert short.data["gpus"]["devices"][0]["processes"] is None  # driver cannot list them


def test_help_page_has_examples(shell) -> None:
    doc = shell.find_line_magic("gpuinfo").__doc__
    assert "Examples" in doc and "%gpuinfo --processes" in doc
    assert "--json" in doc and "-p, --processes" in doc  # the generated option list


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("--bogus", "unknown option --bogus"),
        ("extra words", "unrecognized arguments: extra words"),
        ("--json=yes", "ignored explicit argument 'yes'"),
        ("--processes=2", "ignored explicit argument '2'"),
        ("-x", "unknown option -x"),
        ('"unclosed', "No closing quotation"),
        ("--json --json-ish", "unknown option --json-ish"),
    ],
)
def test_wrong_lines_raise_one_line_usage_error(shell, line, message) -> None:
    with pytest.raises(UsageError) as caught:
        shell.run_line_magic("gpuinfo", line)
    text = str(caught.value)
    assert message in text
    assert text.startswith("%gpuinfo: ") and text.endswith("(see %gpuinfo? for usage)")
    assert "\n" not in text


def test_usage_error_in_a_cell_shows_no_traceback(shell, capsys) -> None:
    result = shell.run_cell("%gpuinfo --bogus")
    captured = capsys.readouterr()
    assert isinstance(result.error_in_exec, UsageError)
    assert "UsageError: %gpuinfo: unknown option --bogus" in captured.err
    assert "Traceback" not in captured.out + captured.err
