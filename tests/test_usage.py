"""The usage and cost report against recorded sample histories with figures known by hand."""

from __future__ import annotations

import csv
import json
import re
import threading
import time
import tracemalloc
from collections.abc import Iterable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from fifo_reader import read_with_fifo_at
from waiting import wait_for

from ipycloud.runtime.monitor.prices import PRICES_ENV, load_prices
from ipycloud.runtime.monitor.sampler import Sampler, shared_sampler
from ipycloud.runtime.monitor.samples import GpuSample, Sample
from ipycloud.runtime.monitor.session import start_monitoring, stop_monitoring
from ipycloud.runtime.monitor.usage import NO_SAMPLES, UsageTracker, shared_tracker, usage_report

GIB = 2**30
T0 = 1_700_000_000.0
HOUR = 3600
# A price table entry with a round rate, so that the expected cost is plain arithmetic.
TWO_T4 = {"test:two-t4": {"gpu": "T4", "gpus": 2, "usd_per_hour": 1.5,
                          "source": "https://example.com/prices", "as_of": "2024-01-01"}}


def gpu(index: int, utilization: float | None, memory_used: int, name: str = "Tesla T4",
        memory_total: int = 16 * GIB) -> GpuSample:
    return GpuSample(index=index, name=name, utilization=utilization, memory_used=memory_used,
                     memory_total=memory_total, temperature=50.0, power_draw_w=30.0,
                     power_limit_w=70.0)


def sample(time: float, gpus: tuple[GpuSample, ...] = (), cpu: float = 10.0,
           ram_used: int = 4 * GIB) -> Sample:
    return Sample(time=time, cpu_percent=cpu, ram_used=ram_used, ram_limit=16 * GIB,
                  ram_available=16 * GIB - ram_used, swap_used=0, swap_total=0,
                  process_rss=GIB, gpus=gpus)


def two_gpu_hour() -> list[Sample]:
    """2 T4s for exactly one hour at 1 Hz. GPU 0 is 100% busy with 12 GiB for the first
    30 min, then idle with 2 GiB; GPU 1 idles with 1 GiB throughout. CPU runs at 80% for
    the first half and 20% after; RAM stays at 4 GiB but for one 10 GiB reading."""
    history = []
    for second in range(HOUR):
        first_half = second < HOUR // 2
        history.append(sample(
            T0 + second, cpu=80.0 if first_half else 20.0,
            ram_used=10 * GIB if second == 100 else 4 * GIB,
            gpus=(gpu(0, 100.0 if first_half else 0.0, 12 * GIB if first_half else 2 * GIB),
                  gpu(1, 0.0, GIB))))
    return history


def one_gpu(seconds: Iterable[float], name: str = "Tesla T4") -> list[Sample]:
    return [sample(T0 + second, gpus=(gpu(0, 100.0, GIB, name=name),)) for second in seconds]


def test_one_hour_on_two_gpus_gives_the_figures_worked_out_by_hand() -> None:
    report = usage_report(two_gpu_hour(), instance="test:two-t4", prices=TWO_T4)

    assert report.samples == 3600
    assert report.duration_s == 3600  # 3599 one-second intervals, and the last sample's
    assert (report.started, report.ended, report.uncounted_s) == (T0, T0 + 3600, 0)
    assert report.gpu_count == 2 and report.gpu_hours == 2.0
    assert report.cpu_average_percent == 50.0 and report.cpu_peak_percent == 80.0
    assert report.ram_peak == 10 * GIB and report.ram_limit == 16 * GIB
    assert report.ram_peak_percent == 62.5
    assert report.ram_average == round((3599 * 4 + 10) * GIB / 3600)
    busy, idle = report.gpus
    assert (busy.utilization_average, busy.utilization_peak) == (50.0, 100.0)
    assert (busy.idle_seconds, busy.idle_share) == (1800, 0.5)
    assert (busy.memory_average, busy.memory_peak) == (7 * GIB, 12 * GIB)
    assert (busy.memory_average_percent, busy.memory_peak_percent) == (7 / 16 * 100, 75.0)
    assert (idle.utilization_average, idle.utilization_peak) == (0.0, 0.0)
    assert (idle.idle_seconds, idle.idle_share) == (3600, 1.0)
    assert (busy.kind, busy.seconds, idle.seconds) == ("T4", 3600, 3600)
    assert report.cost is not None
    assert (report.cost.instance, report.cost.hours, report.cost.cost_usd) == (
        "test:two-t4", 1.0, 1.5)
    assert report.cost_basis == "as given"


def test_the_same_run_is_compared_on_instances_with_as_many_gpus_cheapest_first() -> None:
    report = usage_report(two_gpu_hour(), instance="test:two-t4", prices=TWO_T4)

    assert report.comparison_rule == "instances with 2 GPUs"
    listed = [price for price in load_prices(environ={}).instances.values() if price.gpus == 2]
    assert {cost.instance for cost in report.comparison} == {price.key for price in listed}
    costs = [cost.cost_usd for cost in report.comparison]
    assert costs == sorted(costs)
    for cost in report.comparison:  # one hour: the cost is the hourly rate
        assert cost.gpus == 2 and cost.hours == 1.0 and cost.cost_usd == cost.usd_per_hour


def test_ninety_seconds_cost_a_fortieth_of_the_hourly_rate() -> None:
    report = usage_report(one_gpu(range(90)), instance="test:two-t4", prices=TWO_T4)

    assert report.duration_s == 90  # 89 one-second intervals, and the last sample's
    assert report.gpu_hours == pytest.approx(0.025)  # 90 s / 3600 s
    assert report.cost is not None
    assert report.cost.hours == pytest.approx(0.025)
    assert report.cost.cost_usd == pytest.approx(0.0375)  # $1.50/hour x 0.025 h
    for cost in report.comparison:
        assert cost.hours == pytest.approx(0.025)
        assert cost.cost_usd == pytest.approx(cost.usd_per_hour / 40)


def test_two_and_a_half_hours_on_two_gpus_cost_two_and_a_half_rates() -> None:
    busy = (gpu(0, 90.0, 8 * GIB), gpu(1, 60.0, 4 * GIB))
    history = [sample(T0 + second, gpus=busy) for second in range(0, 9000, 10)]

    report = usage_report(history, instance="test:two-t4", prices=TWO_T4)
    assert report.samples == 900
    assert report.duration_s == 9000  # 899 ten-second intervals, and the last sample's
    assert report.gpu_hours == 5.0  # 2 GPUs x 2.5 h
    assert report.cost is not None
    assert (report.cost.hours, report.cost.cost_usd) == (2.5, 3.75)  # $1.50/hour x 2.5 h
    assert "$3.75 for 2 h 30 min at $1.50/hour" in str(report)


def test_colab_compute_units_grow_with_the_time_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab_20240601")
    own = {"colab:T4": {"units_per_hour": 2.0, "usd_per_unit": 0.1}}

    report = usage_report(one_gpu(range(0, 5400, 5)), prices=own)  # 1.5 h
    assert report.cost is not None and report.cost.instance == "colab:T4"
    assert report.cost.compute_units == pytest.approx(3.0)  # 2 units/hour x 1.5 h
    assert report.cost.cost_usd == pytest.approx(0.3)  # 3 units x $0.10


@pytest.mark.parametrize(("utilization", "idle_s"), [
    (0.0, 10),
    (4.99, 10),  # just below the threshold: idle
    (5.0, 0),  # at the threshold: in use
    (5.01, 0),  # just above: in use
])
def test_a_gpu_is_idle_only_below_the_threshold(utilization: float, idle_s: int) -> None:
    history = [sample(T0 + second, gpus=(gpu(0, utilization, GIB),)) for second in range(10)]

    (only,) = usage_report(history).gpus
    assert (only.seconds, only.idle_seconds, only.idle_share) == (10, idle_s, idle_s / 10)


def test_idle_time_adds_up_the_readings_below_the_threshold() -> None:
    # 10 s at 1 Hz: 3 readings at 4.99%, 3 at exactly 5% and 4 at 5.01%.
    readings = [4.99] * 3 + [5.0] * 3 + [5.01] * 4
    history = [sample(T0 + second, gpus=(gpu(0, value, GIB),))
               for second, value in enumerate(readings)]

    (only,) = usage_report(history).gpus
    assert (only.idle_seconds, only.idle_share) == (3, 0.3)
    assert "3 s (30%)" in str(usage_report(history))


@pytest.mark.parametrize(("gap", "counted", "uncounted"), [
    (59, 1 + 59 + 59, 0),  # within the 60 s cap: the gap counts, and the last sample as long
    (60, 1 + 60 + 60, 0),  # at the cap: still within it
    (61, 1 + 60 + 1, 1),  # beyond: the gap counts for the cap, the last sample for 1 s
])
def test_a_gap_at_the_cap_still_counts_in_full(gap: int, counted: int, uncounted: int) -> None:
    report = usage_report(one_gpu([0, 1, 1 + gap]))

    assert (report.duration_s, report.uncounted_s) == (counted, uncounted)
    assert report.gpu_hours == counted / 3600


def test_an_uncommon_gpu_count_is_compared_with_the_next_count_listed() -> None:
    three = [sample(T0 + second, gpus=tuple(gpu(i, 50.0, GIB) for i in range(3)))
             for second in range(10)]

    report = usage_report(three, instance="test:two-t4", prices=TWO_T4)
    assert report.comparison_rule == "instances with 4 GPUs (none is listed with 3)"
    assert report.comparison and {cost.gpus for cost in report.comparison} == {4}

    own = {"test:three": {**TWO_T4["test:two-t4"], "gpus": 3}}
    report = usage_report(three, instance="test:two-t4", prices={**TWO_T4, **own})
    assert report.comparison_rule == "instances with 3 GPUs"
    assert [cost.instance for cost in report.comparison] == ["test:three"]


def test_a_gap_in_the_samples_counts_only_up_to_the_cap() -> None:
    # 10 min at 1 Hz, the laptop sleeps for 2 h, then 10 more min.
    history = one_gpu([*range(600), *range(600 + 7199, 600 + 7199 + 600)])

    report = usage_report(history)
    counted = 599 + 60 + 599 + 1  # the gap counts for the default cap of 60 s
    assert report.duration_s == counted
    assert report.uncounted_s == 8399 - counted
    assert report.gpu_hours == counted / 3600

    tracker = UsageTracker(max_gap=10)
    for each in history:
        tracker.add(each)
    assert tracker.report().duration_s == 599 + 10 + 599 + 1


def test_a_slow_sampler_is_counted_in_full_after_its_first_interval() -> None:
    # A sample every 2 minutes: only the first interval, with nothing shorter seen before
    # it, is held to the 60 s cap; then the cap is 3 intervals.
    report = usage_report(one_gpu(range(0, 3600, 120)))
    assert report.duration_s == 60 + 28 * 120 + 120


def test_a_lone_sample_counts_no_time_and_its_figures_are_the_averages() -> None:
    report = usage_report([sample(T0, cpu=30.0, gpus=(gpu(0, 40.0, 3 * GIB),))])
    assert (report.duration_s, report.gpu_hours) == (0, 0)
    assert report.cpu_average_percent == 30.0
    assert report.gpus[0].utilization_average == 40.0
    assert report.gpus[0].idle_share is None


def test_a_gpu_without_utilisation_readings_has_no_idle_time() -> None:
    report = usage_report([sample(T0 + s, gpus=(gpu(0, None, GIB),)) for s in range(5)])
    only = report.gpus[0]
    assert (only.utilization_average, only.idle_seconds, only.idle_share) == (None, None, None)
    assert "n/a" in str(report)


def test_samples_are_taken_in_time_order() -> None:
    history = two_gpu_hour()
    assert usage_report(history[::-1], prices=TWO_T4) == usage_report(history, prices=TWO_T4)


def test_the_tracker_fed_one_sample_at_a_time_equals_the_report_over_the_list() -> None:
    history = two_gpu_hour()
    tracker = UsageTracker()
    for each in history:
        tracker.add(each)
    assert tracker.samples == len(history)
    assert tracker.report(instance="test:two-t4", prices=TWO_T4) == usage_report(
        history, instance="test:two-t4", prices=TWO_T4)


def test_the_tracker_keeps_no_samples() -> None:
    def stream(start: int, count: int) -> Iterator[Sample]:
        return (sample(T0 + second, gpus=(gpu(0, 50.0, GIB), gpu(1, 5.0, GIB)))
                for second in range(start, start + count))

    tracker = UsageTracker()
    for each in stream(0, 1000):
        tracker.add(each)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for each in stream(1000, 20_000):
            tracker.add(each)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert tracker.samples == 21_000
    assert grown < 20_000  # 20,000 kept samples would take megabytes


def test_the_tracker_counts_while_another_thread_reports() -> None:
    tracker = UsageTracker()
    tracker.add(sample(T0, gpus=(gpu(0, 50.0, GIB),)))
    failures: list[BaseException] = []

    def feed() -> None:
        try:
            for second in range(1, 20_000):
                tracker.add(sample(T0 + second, gpus=(gpu(0, 50.0, GIB),)))
        except BaseException as error:
            failures.append(error)

    feeder = threading.Thread(target=feed)
    feeder.start()
    while feeder.is_alive():  # every report is consistent: one second per sample
        report = tracker.report(instance="test:two-t4", prices=TWO_T4)
        assert report.duration_s == report.samples
    feeder.join()
    assert not failures and tracker.report().duration_s == 20_000


def test_the_report_round_trips_through_json() -> None:
    report = usage_report(two_gpu_hour(), instance="test:two-t4", prices=TWO_T4)
    data = json.loads(report.to_json())
    assert data == report.to_dict()
    assert data["gpu_hours"] == 2.0
    assert [gpu["idle_seconds"] for gpu in data["gpus"]] == [1800, 3600]
    assert data["cost"]["cost_usd"] == 1.5 and data["cost"]["source"].startswith("https://")
    assert list(data) == ["started", "ended", "duration_s", "uncounted_s", "samples",
                          "gpu_count", "gpu_hours", "idle_below_percent",
                          "cpu_average_percent", "cpu_peak_percent", "ram_average",
                          "ram_peak", "ram_limit", "gpus", "cost", "cost_basis",
                          "comparison_rule", "comparison", "prices_about"]


def test_the_csv_file_reads_back_with_the_csv_module(tmp_path: Path) -> None:
    report = usage_report(two_gpu_hour(), instance="test:two-t4", prices=TWO_T4)
    target = tmp_path / "usage.csv"
    target.write_text("an older report\n")

    assert report.to_csv(target) == target
    with target.open(newline="", encoding="utf-8") as file:
        rows = list(csv.reader(file))
    assert rows[0] == ["section", "item", "field", "value"]
    assert {len(row) for row in rows} == {4}
    cells = {(section, item, name): value for section, item, name, value in rows[1:]}
    assert float(cells["session", "", "gpu_hours"]) == 2.0
    assert float(cells["session", "", "duration_s"]) == 3600
    assert float(cells["gpu", "0", "idle_seconds"]) == 1800
    assert float(cells["gpu", "1", "idle_share"]) == 1.0
    assert cells["gpu", "1", "name"] == "Tesla T4"
    assert float(cells["cost", "test:two-t4", "cost_usd"]) == 1.5
    assert cells["cost", "test:two-t4", "as_of"] == "2024-01-01"
    compared = {item for section, item, _ in cells if section == "compare"}
    assert compared == {cost.instance for cost in report.comparison}
    assert [path.name for path in tmp_path.iterdir()] == ["usage.csv"]  # no temporary left
    with pytest.raises(FileNotFoundError, match=r"^cannot write .*/missing/usage\.csv: the "
                                                r"folder .*/missing does not exist$"):
        report.to_csv(tmp_path / "missing" / "usage.csv")


def test_the_text_and_html_reports_show_the_figures() -> None:
    report = usage_report(two_gpu_hour(), instance="test:two-t4", prices=TWO_T4)
    text = str(report)

    assert re.search(r"^GPU-hours +2\.00 \(2 GPUs\)$", text, re.MULTILINE)
    assert re.search(r"^Estimated cost +\$1\.50 for 1 h at \$1\.50/hour \(rate as of "
                     r"2024-01-01: https://example\.com/prices\)$", text, re.MULTILINE)
    lines = text.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("GPU  Name")))
    table = lines[header:header + 3]
    column = table[0].index("Idle (<5%)")
    assert [row[column:].split("  ")[0] for row in table[1:]] == ["30 min (50%)", "1 h (100%)"]
    assert "The same 1 h on instances with 2 GPUs, cheapest first" in text

    page = report._repr_html_()
    assert "<td>30 min (50%)</td>" in page and "<td>7.0 GiB (44%)</td>" in page
    assert "<td style='text-align:left'>test:two-t4 (as given)</td>" in page


def test_the_shipped_price_table_loads_and_names_a_source_and_date_for_every_rate() -> None:
    raw = json.loads(resources.files("ipycloud").joinpath("data/prices.json").read_text())
    for key, entry in raw["instances"].items():
        assert entry["source"].startswith("https://"), key
        assert re.fullmatch(r"\d{4}-\d{2}(-\d{2})?", entry["as_of"]), key
        assert entry["verified"] is False, key
    table = load_prices(environ={})
    assert set(table.instances) == set(raw["instances"])
    assert {price.provider for price in table.instances.values()} == {
        "colab", "kaggle", "aws", "gcp", "azure", "paperspace", "lambda"}
    assert "on-demand" in table.about and "us-east-1" in table.about
    colab = table.instances["colab:T4"]
    assert colab.units_per_hour is not None
    assert colab.usd_per_hour == colab.units_per_hour * raw["instances"]["colab:T4"][
        "usd_per_unit"]


@pytest.mark.parametrize(("name", "memory", "kind"), [
    ("Tesla T4", 15 * GIB, "T4"),
    ("NVIDIA L4", 22 * GIB, "L4"),
    ("NVIDIA A10G", 22 * GIB, "A10G"),
    ("NVIDIA A10", 22 * GIB, "A10"),
    ("NVIDIA A100-SXM4-40GB", 40 * GIB, "A100 40GB"),
    ("NVIDIA A100-SXM4-80GB", 80 * GIB, "A100 80GB"),
    ("NVIDIA A100 80GB PCIe", None, "A100 80GB"),
    ("NVIDIA H100 80GB HBM3", 80 * GIB, "H100"),
    ("Tesla V100-SXM2-16GB", 16 * GIB, "V100"),
    ("Tesla P100-PCIE-16GB", 16 * GIB, "P100"),
    ("Quadro P4000", 8 * GIB, "P4000"),
    ("NVIDIA RTX A4000", 16 * GIB, "A4000"),
    ("NVIDIA GeForce RTX 4090", 24 * GIB, None),
])
def test_gpu_names_match_the_kinds_of_the_price_table(name: str, memory: int | None,
                                                      kind: str | None) -> None:
    assert load_prices(environ={}).kind_of(name, memory) == kind


def test_on_colab_with_a_t4_the_cost_is_in_colab_compute_units(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab_20240601")
    own = {"colab:T4": {"units_per_hour": 2.0, "usd_per_unit": 0.1}}

    report = usage_report(one_gpu(range(HOUR)), prices=own)
    assert report.cost is not None
    assert report.cost.instance == "colab:T4"
    assert (report.cost.compute_units, report.cost.cost_usd) == (2.0, 2.0 * 0.1)
    assert report.cost_basis == ("guessed from the platform (Google Colab) and the GPUs "
                                 "(1 x T4)")
    assert "colab:T4" not in {cost.instance for cost in report.comparison}
    assert "2 Colab compute units/hour, 2.00 units in all" in str(report)


def test_on_kaggle_with_two_t4s_the_run_is_free(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    report = usage_report(two_gpu_hour())
    assert report.cost is not None
    assert (report.cost.instance, report.cost.cost_usd) == ("kaggle:T4x2", 0.0)


def test_an_instance_that_cannot_be_told_still_gets_the_comparison(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTERHUB_USER", "someone")
    report = usage_report(one_gpu(range(HOUR)))

    assert report.cost is None
    assert report.cost_basis == "the platform (JupyterHub) does not tell which instance this is"
    assert "Instance        not known: the platform (JupyterHub)" in str(report)
    assert report.comparison and {cost.gpus for cost in report.comparison} == {1}
    assert report.to_dict()["cost"] is None

    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab_20240601")
    report = usage_report(one_gpu(range(10), name="NVIDIA GeForce RTX 4090"))
    assert report.cost is None
    assert report.cost_basis == "the GPUs are of no single listed kind on Google Colab"


def test_an_unknown_instance_names_the_close_matches() -> None:
    with pytest.raises(ValueError, match=r"^unknown instance 'aws:g5\.xlarg' \(close matches: "
                                         r"aws:g5\.xlarge"):
        usage_report(one_gpu(range(10)), instance="aws:g5.xlarg")
    with pytest.raises(ValueError, match=r"^unknown instance 'nothing' \(listed: aws:"):
        usage_report(one_gpu(range(10)), instance="nothing")
    report = usage_report(one_gpu(range(10)), instance="AWS:G5.XLARGE")
    assert report.cost is not None and report.cost.instance == "aws:g5.xlarge"


def test_no_samples_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError) as caught:
        usage_report([])
    assert str(caught.value) == NO_SAMPLES
    assert NO_SAMPLES == ("no samples recorded yet: start monitoring with "
                          "ipycloud.runtime.monitor.session.start_monitoring()")
    with pytest.raises(ValueError, match="no samples recorded yet"):
        UsageTracker().report()

    with pytest.raises(ValueError, match="no samples recorded yet"):
        usage_report()
    for each in one_gpu(range(61)):
        shared_tracker().add(each)
    assert usage_report().duration_s == 61 and shared_tracker() is shared_tracker()


def test_a_user_rate_replaces_the_listed_one(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = load_prices(environ={}).instances
    table = load_prices({"aws:g4dn.xlarge": {"usd_per_hour": 0.3}}, environ={})
    mine = table.instances["aws:g4dn.xlarge"]
    assert (mine.usd_per_hour, mine.gpu, mine.gpus) == (0.3, "T4", 1)  # the hardware is kept
    assert (mine.source, mine.as_of, mine.verified) == ("prices mapping", None, True)
    assert table.instances["aws:g5.xlarge"] == shipped["aws:g5.xlarge"]

    colab = load_prices({"colab:T4": {"usd_per_unit": 0.2}}, environ={}).instances["colab:T4"]
    units = shipped["colab:T4"].units_per_hour
    assert units is not None and colab.usd_per_hour == units * 0.2
    # Another form of rate replaces the listed one instead of clashing with it.
    flat = load_prices({"colab:T4": {"usd_per_hour": 0.5}}, environ={}).instances["colab:T4"]
    assert (flat.usd_per_hour, flat.units_per_hour) == (0.5, None)

    team = tmp_path / "team-prices.json"
    team.write_text(json.dumps({"instances": {"aws:g4dn.xlarge": {
        "usd_per_hour": 0.25, "source": "our contract", "as_of": "2025-01"}}}))
    monkeypatch.setenv(PRICES_ENV, str(team))
    from_file = load_prices().instances["aws:g4dn.xlarge"]
    assert (from_file.usd_per_hour, from_file.source, from_file.as_of) == (
        0.25, "our contract", "2025-01")
    assert load_prices(team).instances["aws:g4dn.xlarge"].usd_per_hour == 0.25
    # The prices= argument wins over the file in $IPYCLOUD_PRICES.
    report = usage_report(one_gpu(range(HOUR)), instance="aws:g4dn.xlarge",
                          prices={"aws:g4dn.xlarge": {"usd_per_hour": 0.2}})
    assert report.cost is not None and report.cost.cost_usd == 0.2


ENTRY: dict[str, Any] = {"gpu": "T4", "gpus": 1, "usd_per_hour": 1.0,
                         "source": "https://example.com", "as_of": "2024-01"}


@pytest.mark.parametrize(("content", "message"), [
    ("{", r"not valid JSON: Expecting property name enclosed in double quotes at line 1 "
          r"column 2"),
    ("[]", r"expected a JSON object of instances, got list"),
    (json.dumps({"x:y": {**ENTRY, "usd_per_hour": -1}}),
     r"entry 'x:y': usd_per_hour must be a finite number >= 0, got -1"),
    ('{"x:y": {"gpu": "T4", "gpus": 1, "usd_per_hour": NaN}}',
     r"entry 'x:y': usd_per_hour must be a finite number >= 0, got None"),
    (json.dumps({"x:y": {**ENTRY, "usd_per_hour": "1.0"}}),
     r"entry 'x:y': usd_per_hour must be a finite number >= 0, got '1.0'"),
    (json.dumps({"x:y": {**ENTRY, "usd_per_hr": 1}}), r"entry 'x:y': unknown field 'usd_per_hr'"),
    (json.dumps({"x:y": {"gpus": 1, "usd_per_hour": 1}}), r"entry 'x:y': gpu must name"),
    (json.dumps({"x:y": {**ENTRY, "gpus": 1.5}}), r"entry 'x:y': gpus must be a whole number"),
    (json.dumps({"g5.xlarge": ENTRY}), r"entry 'g5.xlarge': name entries provider:instance"),
    (json.dumps({"x:y": {**ENTRY, "units_per_hour": 2, "usd_per_unit": 0.1}}),
     r"entry 'x:y': give usd_per_hour, or units_per_hour with usd_per_unit"),
    (json.dumps({"x:y": {**ENTRY, "as_of": "June 2024"}}), r"entry 'x:y': as_of must be"),
    (json.dumps({"x:y": {**ENTRY, "verified": "no"}}), r"entry 'x:y': verified must be"),
    (json.dumps({"x:y": "1.0"}), r"entry 'x:y': expected an object of fields"),
    (json.dumps({"currency": "EUR", "instances": {}}), r"only USD prices are supported"),
    (json.dumps({"instances": []}), r"\"instances\" must be an object of instances"),
])
def test_a_malformed_price_file_is_a_one_line_error_naming_file_and_entry(
        tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "prices.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}: {message}") as caught:
        usage_report(one_gpu(range(10)), prices=path)
    assert "\n" not in str(caught.value)


def test_a_missing_price_file_is_a_one_line_error(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(ValueError, match=f"^{re.escape(str(missing))}: cannot read the price "
                                         f"file: No such file or directory$"):
        load_prices(missing, environ={})
    monkeypatch.setenv(PRICES_ENV, str(missing))
    with pytest.raises(ValueError, match=f"^{PRICES_ENV}={re.escape(str(missing))}: cannot "
                                         f"read the price file"):
        usage_report(one_gpu(range(10)))


def test_a_fifo_in_place_of_a_price_file_is_a_one_line_error_not_a_hang(
        tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}: cannot read the price "
                                         f"file: not a regular file$"):
        read_with_fifo_at(path, lambda: load_prices(path, environ={}))


def test_a_price_file_too_large_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    path.write_bytes(b" " * (16 << 20) + b"{}")
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}: cannot read the price "
                                         f"file: .* holds more than 16,777,216 bytes$"):
        load_prices(path, environ={})


def test_attached_to_a_sampler_the_tracker_counts_its_samples() -> None:
    clock = iter(range(1_000_000))

    def probe() -> Sample:  # one sample a second on a clock of its own
        return sample(T0 + next(clock), gpus=(gpu(0, 100.0, GIB), gpu(1, 0.0, GIB)))

    sampler = Sampler(interval=0.01, probe=probe)
    tracker = UsageTracker()
    subscription = tracker.attach(sampler, interval=0.02)
    try:
        assert subscription.active and sampler.running and subscription.interval == 0.02
        deadline = time.monotonic() + 10
        while tracker.samples < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        subscription.cancel()
        sampler.stop()
    assert not subscription.active and not sampler.errors
    report = tracker.report(instance="test:two-t4", prices=TWO_T4)
    assert report.samples == tracker.samples >= 5
    assert report.duration_s == report.samples  # one second per sample
    assert report.gpu_hours == 2 * report.samples / 3600
    assert [gpu.idle_share for gpu in report.gpus] == [0.0, 1.0]


def test_start_monitoring_keeps_one_subscription_at_the_interval_last_asked() -> None:
    sampler = shared_sampler()
    assert sampler.subscribers == 0, "an earlier test left the shared sampler in use"
    try:
        assert start_monitoring() is sampler and sampler.interval == 1.0  # the default
        start_monitoring(0.5)
        assert (sampler.subscribers, sampler.interval) == (1, 0.5)
        start_monitoring()  # no interval asked: the last one stands
        assert (sampler.subscribers, sampler.interval) == (1, 0.5)
        start_monitoring(2.0)
        assert (sampler.subscribers, sampler.interval) == (1, 2.0)
    finally:
        stop_monitoring()
    assert sampler.subscribers == 0
    wait_for(lambda: not sampler.running)
