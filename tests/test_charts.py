"""Line charts as SVG text: read back with an XML parser, coordinates checked by hand.

The default chart is 340 x 210 with its plot area from x 56 to 326 and from y 40 (top) to
176 (bottom): the expected coordinates below are worked out from those.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ElementTree

from ipycloud.runtime.charts import Series, line_chart, nice_step

SVG = "{http://www.w3.org/2000/svg}"
BLUE = "#1f77b4"


def parsed(svg: str) -> ElementTree.Element:
    return ElementTree.fromstring(svg)


def group(chart: ElementTree.Element, name: str) -> ElementTree.Element:
    found = chart.find(f"{SVG}g[@class='{name}']")
    assert found is not None, f"no {name} group"
    return found


def texts(element: ElementTree.Element) -> list[str]:
    return [text.text or "" for text in element.iter(f"{SVG}text")]


def polylines(chart: ElementTree.Element, label: str) -> list[list[tuple[float, float]]]:
    series = chart.find(f"{SVG}g[@class='series'][@data-label='{label}']")
    assert series is not None
    return [[tuple(map(float, pair.split(","))) for pair in line.get("points", "").split()]
            for line in series.iter(f"{SVG}polyline")]


def dots(chart: ElementTree.Element, label: str) -> list[tuple[float, float]]:
    series = chart.find(f"{SVG}g[@class='series'][@data-label='{label}']")
    assert series is not None
    return [(float(dot.get("cx", "")), float(dot.get("cy", "")))
            for dot in series.iter(f"{SVG}circle")]


def test_points_land_on_the_axes_ticks_by_their_values() -> None:
    chart = parsed(line_chart("loss", [Series("loss", [(0, 0.0), (5, 5.0), (10, 10.0)], BLUE)],
                              log_y=False))
    assert texts(group(chart, "x-ticks")) == ["0", "2", "4", "6", "8", "10"]
    assert texts(group(chart, "y-ticks")) == ["0", "2", "4", "6", "8", "10"]
    assert polylines(chart, "loss") == [[(56, 176), (191, 108), (326, 40)]]
    assert dots(chart, "loss") == [(326, 40)]  # the last value
    assert len(list(group(chart, "axes").iter(f"{SVG}line"))) == 2
    assert chart.find(f"{SVG}text[@class='x-label']").text == "step"  # type: ignore[union-attr]


def test_the_legend_gives_each_series_last_value() -> None:
    chart = parsed(line_chart("loss", [Series("loss", [(1, 2.5), (2, 0.123456)], BLUE),
                                       Series("val_loss", [(2, 0.5)], "#f80", markers=True)]))
    assert texts(group(chart, "legend")) == ["loss 0.1235", "val_loss 0.5"]


def test_a_y_axis_over_decades_of_positive_values_is_logarithmic() -> None:
    chart = parsed(line_chart("loss", [Series("loss", [(0, 1.0), (1, 0.1), (2, 0.01)], BLUE)]))
    ticks = group(chart, "y-ticks")
    assert ticks.get("data-scale") == "log"
    assert texts(ticks) == ["0.01", "0.02", "0.05", "0.1", "0.2", "0.5", "1"]
    assert polylines(chart, "loss") == [[(56, 40), (191, 108), (326, 176)]]  # evenly spaced


def test_values_at_or_below_zero_keep_the_axis_linear() -> None:
    chart = parsed(line_chart("lr", [Series("lr", [(0, 0.0), (1, 0.001), (2, 0.1)], BLUE)]))
    assert group(chart, "y-ticks").get("data-scale") == "linear"


def test_non_finite_values_break_the_line_and_a_lone_point_is_a_dot() -> None:
    points = [(0, 1.0), (1, math.nan), (2, 2.0), (3, 3.0), (4, math.inf)]
    chart = parsed(line_chart("loss", [Series("loss", points, BLUE)], log_y=False))
    # the finite points span x 0..3 (on 56..326) and y 1..3 (on 176..40)
    assert polylines(chart, "loss") == [[(236, 108), (326, 40)]]
    assert dots(chart, "loss") == [(56, 176), (326, 40)]
    assert texts(group(chart, "legend")) == ["loss inf"]
    assert texts(group(chart, "y-ticks")) == ["1", "1.5", "2", "2.5", "3"]


def test_a_single_point_sits_mid_chart_with_ticks_around_it() -> None:
    chart = parsed(line_chart("loss", [Series("loss", [(10, 0.5)], BLUE)]))
    assert polylines(chart, "loss") == []
    assert dots(chart, "loss") == [(191, 108)]
    assert texts(group(chart, "x-ticks")) == ["9", "10", "11"]
    assert "0.5" in texts(group(chart, "y-ticks"))


def test_a_constant_series_gets_a_range_around_its_value() -> None:
    chart = parsed(line_chart("lr", [Series("lr", [(0, 0.001), (10, 0.001)], BLUE)]))
    assert polylines(chart, "lr") == [[(56, 108), (326, 108)]]
    assert "0.001" in texts(group(chart, "y-ticks"))


def test_a_chart_without_points_says_so() -> None:
    chart = parsed(line_chart("loss", [Series("loss", [(0, math.nan)], BLUE)]))
    assert "no data yet" in texts(chart)
    assert chart.find(f"{SVG}g[@class='y-ticks']") is None


def test_titles_and_labels_are_escaped() -> None:
    chart = parsed(line_chart('<b>&"', [Series("a<b", [(0, 1.0), (1, 2.0)], BLUE)],
                              x_label="<x>"))
    assert chart.find(f"{SVG}title").text == '<b>&"'  # type: ignore[union-attr]
    assert texts(group(chart, "legend")) == ["a<b 2"]
    assert chart.find(f"{SVG}text[@class='x-label']").text == "<x>"  # type: ignore[union-attr]


def test_tick_steps_are_one_two_or_five_times_a_power_of_ten() -> None:
    assert [nice_step(rough) for rough in (0.013, 0.27, 4.0, 101.6, 800.0)] == \
        [0.01, 0.2, 5.0, 100.0, 1000.0]


def test_tick_labels_read_as_decimals() -> None:
    chart = parsed(line_chart("acc", [Series("acc", [(0, 0.1), (1, 0.3)], BLUE)]))
    assert texts(group(chart, "y-ticks")) == ["0.1", "0.15", "0.2", "0.25", "0.3"]
